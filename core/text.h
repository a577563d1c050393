// core/text.h: text from elsewhere (job names, reasons, worker names, ranks' lines) made safe
// to print on a terminal. A name holding ESC [2J would clear the screen, a CR or newline would
// forge a table row; JSON output needs none of this (its writer escapes them).
//
//   std::printf("%s\n", core::Printable(job.name()).c_str());
#ifndef SATDAR_CORE_TEXT_H_
#define SATDAR_CORE_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace satdar::core {

// `text` with every control character (C0, DEL, C1), invisible direction or line-separator
// code point (U+2028/9, U+200E/F, U+202A-E, U+2066-9) and byte that is not UTF-8 written as an
// escape: \x1b for a byte, \u202e for a code point. Other text (printable ASCII, UTF-8
// letters) is kept as it is, so a printable name prints unchanged.
std::string Printable(absl::string_view text);

// Printable, cut to at most `max_bytes` of the original text ("..." marks a cut).
std::string PrintableShort(absl::string_view text, size_t max_bytes);

}  // namespace satdar::core

#endif  // SATDAR_CORE_TEXT_H_
