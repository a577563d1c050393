#include "core/text.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace satdar::core {

namespace {

// The length of the valid UTF-8 sequence at text[i] and its code point, or 0.
size_t DecodeUtf8(absl::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  *code_point = cp;
  return n;
}

bool Invisible(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 ||
         cp == 0x2029;
}

}  // namespace

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = c >= 0x80 ? DecodeUtf8(text, i, &cp) : 0;
    if (n == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
      ++i;
    } else if (Invisible(cp)) {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
      i += n;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string PrintableShort(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return Printable(text);
  return Printable(text.substr(0, max_bytes)) + "...";
}

}  // namespace satdar::core
