// core/cuda/sim/fiber.h: the stack switch under the simulator's fibers (kernel_sim.cc).
//
// On x86-64 a hand-written switch saves the six callee-saved registers and the stack pointer
// and nothing else: a few nanoseconds, against ~0.5 us for swapcontext, which also saves the
// signal mask with a system call. A 1024 x 256-thread grid with ten barriers makes ~6 million
// switches, so this decides whether CI can run training steps. Elsewhere, ucontext.
// MXCSR and the x87 control word are not switched: kernels never change rounding modes.
// -DSATDAR_SIM_UCONTEXT forces ucontext on x86-64 too (for comparison, or for a tool that
// does not follow the hand-written switch).
#ifndef SATDAR_CORE_CUDA_SIM_FIBER_H_
#define SATDAR_CORE_CUDA_SIM_FIBER_H_

#include <cstddef>

#if !defined(__x86_64__) || defined(SATDAR_SIM_UCONTEXT)
#include <ucontext.h>
#endif

namespace satdar::cuda_sim {

// A saved execution context.
struct FiberContext {
#if defined(__x86_64__) && !defined(SATDAR_SIM_UCONTEXT)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// Makes `ctx` start `entry(arg)` on the stack [stack_lo, stack_hi) when switched to. `entry`
// must never return; it ends by switching away for good.
void MakeFiberContext(FiberContext* ctx, void* stack_lo, void* stack_hi, void (*entry)(void*),
                      void* arg);

// Saves the current context in `from` and resumes `to`.
void SwitchFiber(FiberContext* from, FiberContext* to);

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_FIBER_H_
