// error — the one exception type for bad input.
//
// Every user-facing input problem (unknown format, malformed config, checkpoint or result file,
// wrong shapes, NaN where none may be) is an InputError whose what() is one line naming the problem
// and, where there is one, the file and how to fix it. The CLI prints it and exits with status 2.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace mantis {

// what() is always one line: the message's control bytes (line breaks included) are escaped here,
// once, so that user text echoed in a message (a TOML key, a file name) cannot break it — for the
// CLI's stderr line and for Python's mantis.Error alike.
struct InputError : std::runtime_error {
  explicit InputError(std::string_view message);
};

// `s` as one line of valid UTF-8: control characters (C0 — NUL, ESC, line breaks, … —, DEL, C1) and
// bytes that are not UTF-8 written as \xNN, the Unicode line and paragraph separators as \uNNNN:
// what a terminal, str.splitlines() or Python's decoder would break at. User input echoed in an
// InputError (a NUL would end what(), a line break split the message) goes through it.
std::string escape_control(std::string_view s);

}  // namespace mantis
