//! The `prepfs` binary: parse the command line and run it.

fn main() -> std::process::ExitCode {
    prepfs::cli::main()
}
