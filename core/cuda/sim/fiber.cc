// core/cuda/sim/fiber.cc: see fiber.h.
#include "core/cuda/sim/fiber.h"

#include <cstdint>

#if defined(__x86_64__) && !defined(SATDAR_SIM_UCONTEXT)

// satdar_sim_switch(void** save_sp, void* new_sp): pushes the callee-saved registers on the
// current stack, stores the stack pointer in *save_sp, loads new_sp and pops the other
// context's registers; `ret` then continues where that context called the switch (or, for a
// new fiber, in satdar_sim_fiber_start).
asm(R"(
  .text
  .p2align 4
  .globl satdar_sim_switch
  .hidden satdar_sim_switch
  .type satdar_sim_switch,@function
satdar_sim_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size satdar_sim_switch,.-satdar_sim_switch

  .p2align 4
  .globl satdar_sim_fiber_start
  .hidden satdar_sim_fiber_start
  .type satdar_sim_fiber_start,@function
satdar_sim_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r13, %rdi
  jmpq *%r12
  .cfi_endproc
  .size satdar_sim_fiber_start,.-satdar_sim_fiber_start
)");

extern "C" void satdar_sim_switch(void** save_sp, void* new_sp);
extern "C" void satdar_sim_fiber_start();

namespace satdar::cuda_sim {

void MakeFiberContext(FiberContext* ctx, void* stack_lo, void* stack_hi, void (*entry)(void*),
                      void* arg) {
  (void)stack_lo;
  // The entry function must see the stack as after a `call`: rsp % 16 == 8 at its first
  // instruction. `ret` in the switch pops the start address at slot[6]; satdar_sim_fiber_start
  // then jumps (not calls) to entry with rsp at slot[7], a zero return address.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack_hi) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top - 16 - 6 * sizeof(void*));
  slot[0] = nullptr;                                 // r15
  slot[1] = nullptr;                                 // r14
  slot[2] = arg;                                     // r13: entry's argument
  slot[3] = reinterpret_cast<void*>(entry);          // r12: entry
  slot[4] = nullptr;                                 // rbx
  slot[5] = nullptr;                                 // rbp
  slot[6] = reinterpret_cast<void*>(&satdar_sim_fiber_start);
  slot[7] = nullptr;                                 // entry's (never used) return address
  ctx->sp = slot;
}

void SwitchFiber(FiberContext* from, FiberContext* to) { satdar_sim_switch(&from->sp, to->sp); }

}  // namespace satdar::cuda_sim

#else  // !__x86_64__: ucontext.

namespace satdar::cuda_sim {
namespace {

// makecontext passes ints only: the entry and its argument travel as 32-bit halves.
void UcontextStart(unsigned e_hi, unsigned e_lo, unsigned a_hi, unsigned a_lo) {
  auto entry = reinterpret_cast<void (*)(void*)>((uintptr_t{e_hi} << 32) | e_lo);
  void* arg = reinterpret_cast<void*>((uintptr_t{a_hi} << 32) | a_lo);
  entry(arg);
}

}  // namespace

void MakeFiberContext(FiberContext* ctx, void* stack_lo, void* stack_hi, void (*entry)(void*),
                      void* arg) {
  getcontext(&ctx->uc);
  ctx->uc.uc_stack.ss_sp = stack_lo;
  ctx->uc.uc_stack.ss_size =
      static_cast<size_t>(static_cast<char*>(stack_hi) - static_cast<char*>(stack_lo));
  ctx->uc.uc_link = nullptr;
  const auto e = reinterpret_cast<uintptr_t>(entry);
  const auto a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&ctx->uc, reinterpret_cast<void (*)()>(&UcontextStart), 4,
              static_cast<unsigned>(e >> 32), static_cast<unsigned>(e),
              static_cast<unsigned>(a >> 32), static_cast<unsigned>(a));
}

void SwitchFiber(FiberContext* from, FiberContext* to) { swapcontext(&from->uc, &to->uc); }

}  // namespace satdar::cuda_sim

#endif
