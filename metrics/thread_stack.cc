// Thread stacks for civetweb. Debian's civetweb 1.15 (under prometheus-cpp's Exposer and the
// coordinator's HTTP server) creates its threads with a fixed 100 KiB stack
// (pthread_attr_setstacksize, not configurable at run time). glibc carves a thread's static TLS
// out of its stack, and with the CUDA libraries loaded (cuBLASLt, cuBLAS, NCCL, OpenBLAS) that
// TLS alone is about 180 KiB, so every civetweb thread fails to start (EINVAL, "Cannot create
// threads"). Linked into the program (alwayslink), this definition takes the place of libc's
// for every library and raises any requested stack below kMinStack to kMinStack; larger
// requests pass unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {
constexpr size_t kMinStack = size_t{1} << 20;
using SetStackSize = int (*)(pthread_attr_t*, size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, size < kMinStack ? kMinStack : size);
}
