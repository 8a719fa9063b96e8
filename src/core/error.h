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

// `s` with its control bytes (NUL, ESC, line breaks, ...) written as \xNN: user input echoed in an
// InputError, whose what() would end at a NUL and which must stay one line on a terminal.
std::string escape_control(std::string_view s);

}  // namespace mantis
