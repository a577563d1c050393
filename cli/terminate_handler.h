// cli/terminate_handler.h: the programs' last line of defence. satdar never throws, but the
// C++ library does (std::bad_alloc when an allocation fails anyway, despite the memory
// estimate; std::system_error when the system refuses a thread). Such an exception ends the
// process with exit code 1 (a fault, which a scheduler may retry) and a message, never with
// abort's 134, which looks like a crash. Compiled with exceptions (the one file besides the
// Gloo communicator).
#ifndef SATDAR_CLI_TERMINATE_HANDLER_H_
#define SATDAR_CLI_TERMINATE_HANDLER_H_

namespace satdar::cli {

// std::set_terminate with the handler; call first thing in main.
void InstallTerminateHandler();
// A function the handler calls before the process ends (e.g. removing an unfinished output).
void SetTerminateCleanup(void (*cleanup)());

}  // namespace satdar::cli

#endif  // SATDAR_CLI_TERMINATE_HANDLER_H_
