// The satdar command-line program (see worker/cli.h).
//
// The one file compiled with exceptions besides the Gloo communicator: satdar itself never
// throws, but the C++ library does (std::bad_alloc when an allocation fails anyway, despite the
// memory estimate; std::system_error when the system refuses a thread). Such an exception must
// end the process with exit code 1 (a fault, which a scheduler may retry) and a message, never
// with abort's 134, which looks like a crash.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <system_error>

#include "worker/cli.h"

namespace {

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
  std::fprintf(stderr, "satdar: error: %s\n", what.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(OnTerminate);
  return satdar::worker::Main(argc, argv);
}
