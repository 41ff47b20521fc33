//! The binary's commands as a user runs them: the offline ones and `doctor`/`status`.

mod command_line;
mod inject;
mod inspect;
mod offline;
mod upstream;
