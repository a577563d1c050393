#include "cli/terminate_handler.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <system_error>

namespace satdar::cli {

namespace {

void (*g_cleanup)() = nullptr;

[[noreturn]] void OnTerminate() {
  std::exception_ptr error = std::current_exception();
  if (error == nullptr) std::abort();  // not an exception: a programmer error
  std::string what = "an unknown exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    what = "out of memory: an allocation failed (the run needs more memory than this machine "
           "has left)";
  } catch (const std::system_error& e) {
    what = std::string("the system refused: ") + e.what();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fflush(stdout);
  if (g_cleanup != nullptr) g_cleanup();
  std::fprintf(stderr, "satdar: error: %s\n", what.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

}  // namespace

void InstallTerminateHandler() { std::set_terminate(OnTerminate); }

void SetTerminateCleanup(void (*cleanup)()) { g_cleanup = cleanup; }

}  // namespace satdar::cli
