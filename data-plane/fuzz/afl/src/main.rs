//! AFL++ harness for the data plane's fuzz targets (`../targets.rs`): `holdfast-fuzz-afl
//! <target>` reads inputs from AFL++ in persistent mode and aborts when one breaks the
//! target's property, so that AFL++ saves it as a crash. Run through `../afl.sh`.

use std::path::Path;

#[path = "../../targets.rs"]
mod targets;

fn main() {
    let target = std::env::args().nth(1).unwrap_or_default();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
    let check: Box<dyn Fn(&[u8]) -> Result<(), String>> = match target.as_str() {
        "framing" => Box::new(targets::framing),
        "h1" => Box::new(targets::h1),
        "differential" => {
            let engines = targets::Engines::new();
            Box::new(move |bytes| targets::differential(&engines, bytes))
        }
        "path" => {
            let table = targets::sample_table();
            Box::new(move |bytes| targets::path(&table, bytes))
        }
        "snapshot" => Box::new(targets::snapshot),
        "state_file" => {
            let valid = targets::seeds(&corpus, "state_file");
            Box::new(move |bytes| targets::state_file(&valid, bytes))
        }
        other => {
            eprintln!(
                "unknown target {other:?}: framing, h1, differential, path, snapshot or state_file"
            );
            std::process::exit(2);
        }
    };
    // A panic aborts the process (panic = "abort"), so no state outlives one.
    let check = std::panic::AssertUnwindSafe(check);
    afl::fuzz!(|bytes: &[u8]| {
        let whole = &check; // capture the wrapper, not the field inside it
        if let Err(why) = (whole.0)(bytes) {
            panic!("{target}: {why}");
        }
    });
}
