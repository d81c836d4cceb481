//! The flag reference of a binary, rendered from its clap definition, so that the tables
//! in docs/reference.md are what the binary accepts. Each binary has a test that compares
//! its table with the document's ([`check`]); `HOLDFAST_BLESS=1` rewrites the table instead.

use std::path::Path;

/// The environment variable that makes [`check`] rewrite the document instead of failing.
pub const BLESS: &str = "HOLDFAST_BLESS";

/// A Markdown table of `command`'s flags (flag, environment variable, default and what it
/// does, from its doc comment on one line), then each subcommand with its arguments and
/// its own table (a subcommand without flags of its own says so).
pub fn reference(command: &clap::Command) -> String {
    // Built as the binary builds it: flags' implied defaults (`false` for a switch) set.
    let mut command = command.clone();
    command.build();
    let command = &command;
    let mut out = table(command, false).unwrap_or_default();
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let positionals: Vec<String> = sub
            .get_positionals()
            .map(|a| {
                a.get_value_names()
                    .and_then(|names| names.first())
                    .map(ToString::to_string)
                    .unwrap_or_else(|| a.get_id().to_string().to_uppercase())
            })
            .collect();
        let usage = std::iter::once(command.get_name())
            .chain(std::iter::once(sub.get_name()))
            .chain(positionals.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let about = sub.get_about().map(|a| one_line(&a.to_string()));
        out.push_str(&format!(
            "\n`{usage}`{}\n\n",
            about.map(|a| format!(": {a}")).unwrap_or_default()
        ));
        out.push_str(&table(sub, true).unwrap_or_else(|| "No flags of its own.\n".to_owned()));
    }
    out
}

/// The table of `command`'s own flags, None when it has none; a subcommand's
/// (`inherited`) leaves out the global flags its parent's table lists.
fn table(command: &clap::Command, inherited: bool) -> Option<String> {
    let mut out =
        String::from("| flag | env | default | what it does |\n| --- | --- | --- | --- |\n");
    let mut rows = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if arg.is_hide_set()
            || matches!(long, "help" | "version")
            || (inherited && arg.is_global_set())
        {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if arg.is_required_set() {
            "(required)".to_owned()
        } else if defaults.is_empty() {
            String::new()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let mut what = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| one_line(&h.to_string()))
            .unwrap_or_default();
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if arg.get_action().takes_values() && !values.is_empty() {
            what.push_str(&format!(" One of {}.", values.join(", ")));
        }
        out.push_str(&format!(
            "| `--{long}` | {env} | {default} | {} |\n",
            what.replace('|', "\\|")
        ));
        rows += 1;
    }
    (rows > 0).then_some(out)
}

/// Help text on one line: runs of white space become one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The markers around `binary`'s table in a document.
fn markers(binary: &str) -> (String, String) {
    (
        format!(
            "<!-- flags of {binary}: made from its clap definition; HOLDFAST_BLESS=1 and its flag reference test rewrite it -->\n"
        ),
        format!("<!-- end of the flags of {binary} -->"),
    )
}

/// `document` with `binary`'s table between its markers replaced by `table`.
pub fn replace(document: &str, binary: &str, table: &str) -> Result<String, String> {
    let (start, end) = markers(binary);
    let from = document.find(&start).ok_or_else(|| {
        format!(
            "no table of {binary}: the document lacks `{}`",
            start.trim_end()
        )
    })? + start.len();
    let to = document[from..]
        .find(&end)
        .map(|at| from + at)
        .ok_or_else(|| format!("the table of {binary} has no end marker `{end}`"))?;
    Ok(format!("{}{table}{}", &document[..from], &document[to..]))
}

/// Whether `document`'s table of `command` is what the binary accepts. With
/// `HOLDFAST_BLESS` set, the document is rewritten with the current table instead.
pub fn check(document: &Path, command: &clap::Command) -> Result<(), String> {
    check_or_bless(document, command, std::env::var_os(BLESS).is_some())
}

/// For a binary's test: panics unless docs/reference.md (beside the crate at
/// `crate_dir`, its `CARGO_MANIFEST_DIR`) holds `command`'s current table. With
/// `HOLDFAST_BLESS` set, the document is rewritten instead.
pub fn assert_documented(crate_dir: &str, command: &clap::Command) {
    let document = Path::new(crate_dir).join("../docs/reference.md");
    if let Err(e) = check(&document, command) {
        panic!("{e}");
    }
}

fn check_or_bless(document: &Path, command: &clap::Command, bless: bool) -> Result<(), String> {
    let text =
        std::fs::read_to_string(document).map_err(|e| format!("{}: {e}", document.display()))?;
    let current = replace(&text, command.get_name(), &reference(command))?;
    if current == text {
        return Ok(());
    }
    if bless {
        return std::fs::write(document, current)
            .map_err(|e| format!("{}: {e}", document.display()));
    }
    Err(format!(
        "{}'s flag table in {} is stale: run the test again with {BLESS}=1 and commit the document",
        command.get_name(),
        document.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn command() -> Command {
        Command::new("tool")
            .arg(
                Arg::new("listen")
                    .long("listen")
                    .env("TOOL_LISTEN")
                    .default_value("0.0.0.0:80")
                    .help("Where to listen.\nOn two lines, with a | in them."),
            )
            .arg(Arg::new("key").long("key").required(true).help("The key."))
            .arg(
                Arg::new("mode")
                    .long("mode")
                    .value_parser(["fast", "safe"])
                    .help("How."),
            )
            .arg(
                Arg::new("quiet")
                    .long("quiet")
                    .global(true)
                    .action(ArgAction::SetTrue),
            )
            .arg(Arg::new("secret").long("secret").hide(true))
            .arg(Arg::new("file").help("A positional argument."))
            .subcommand(
                Command::new("status").about("Shows the status.").arg(
                    Arg::new("wide")
                        .long("wide")
                        .action(ArgAction::SetTrue)
                        .help("More."),
                ),
            )
            .subcommand(
                Command::new("explain")
                    .about("Explains.")
                    .arg(Arg::new("url").value_name("HOST/PATH").required(true)),
            )
    }

    #[test]
    fn the_table_has_each_visible_flag_with_env_default_and_help_on_one_line() {
        assert_eq!(
            reference(&command()),
            "| flag | env | default | what it does |\n| --- | --- | --- | --- |\n\
             | `--listen` | `TOOL_LISTEN` | `0.0.0.0:80` | Where to listen. On two lines, with a \\| in them. |\n\
             | `--key` |  | (required) | The key. |\n\
             | `--mode` |  |  | How. One of `fast`, `safe`. |\n\
             | `--quiet` |  | `false` |  |\n\
             \n`tool status`: Shows the status.\n\n\
             | flag | env | default | what it does |\n| --- | --- | --- | --- |\n\
             | `--wide` |  | `false` | More. |\n\
             \n`tool explain HOST/PATH`: Explains.\n\n\
             No flags of its own.\n"
        );
    }

    #[test]
    fn only_the_text_between_the_markers_is_replaced_and_missing_markers_are_errors() {
        let (start, end) = markers("tool");
        let doc = format!("before\n{start}old table\n{end}\nafter\n");
        assert_eq!(
            replace(&doc, "tool", "new table\n").unwrap(),
            format!("before\n{start}new table\n{end}\nafter\n")
        );
        assert!(
            replace("no markers", "tool", "t")
                .unwrap_err()
                .contains("no table of tool")
        );
        assert!(
            replace(&format!("{start}no end"), "tool", "t")
                .unwrap_err()
                .contains("no end marker")
        );
        assert!(replace(&doc, "other", "t").is_err());
    }

    #[test]
    fn a_stale_table_fails_the_check_and_a_blessed_one_is_rewritten() {
        let dir = std::env::temp_dir().join(format!("holdfast-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let doc = dir.join("reference.md");
        let (start, end) = markers("tool");
        std::fs::write(&doc, format!("# Flags\n{start}stale\n{end}\n")).unwrap();
        assert!(
            check_or_bless(&doc, &command(), false)
                .unwrap_err()
                .contains("is stale")
        );
        assert_eq!(check_or_bless(&doc, &command(), true), Ok(()));
        let blessed = std::fs::read_to_string(&doc).unwrap();
        assert_eq!(
            blessed,
            format!("# Flags\n{start}{}{end}\n", reference(&command()))
        );
        assert_eq!(check_or_bless(&doc, &command(), false), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
