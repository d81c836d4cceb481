//! The README and the pages of docs/ cite tests by name and link to each other; a rename
//! must not leave a row pointing at nothing, nor a link at a file or heading that is gone.
//! This reads the documents and every Rust file of the repository (with `syn`), checks
//! each citation against the tests and items that exist, and each relative link against
//! the files and headings there are. docs/benchmarks.md is history: its links are checked,
//! its citations (which name the code of their day) are not.
//!
//! What counts as a citation:
//! - in a table column headed `test` or `tests`, and in docs/design.md's prose after
//!   "Test:" or "Tests:" up to the end of the paragraph, every backticked name is a **test**:
//!   `module::…::name`, a bare `name`, or an abbreviation (`faults::api_server::s02_…` is a
//!   name's start, `…name` its end, `module::tests::*` any test of that module). A
//!   backticked path there (`tests/tests/e2e/faults/`, `proto/src/snapshot.rs`) must exist,
//!   and the bare names after it, up to the next `;`, must be tests in that file or folder;
//! - anywhere else, a backticked `module::name` must name some item (a test, function,
//!   type, module, …).
//!
//! Module paths are those `cargo test` prints: `src/a/b.rs` is `a::b`, an inline `mod
//! tests` adds `tests`, the end-to-end binary's modules are `control_plane`,
//! `faults::api_server`, …, and another integration test file is its own name (`fuzz`). A
//! citation matches the end of an item's path, segment by segment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use holdfast_tests::repo_root;

/// Something a citation can name.
#[derive(Debug, Clone)]
struct Item {
    /// Module path and name, as `cargo test` prints it.
    path: Vec<String>,
    /// Whether it is a test.
    test: bool,
    /// The file it is in, relative to the repository root.
    file: String,
}

/// Every test and item in the repository's Rust files.
fn index() -> Vec<Item> {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut items = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let parsed = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let rel = file
            .strip_prefix(&root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        let mut ctx = Walk {
            file: rel,
            items: &mut items,
        };
        ctx.items(&module_of(&file), &parsed.items);
    }
    items
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The module path of a file: relative to its crate (the nearest folder with a
/// Cargo.toml), `src/a/b.rs` is `a::b`, `tests/x.rs` is `x`, `tests/e2e/a/b.rs` is `a::b`.
fn module_of(file: &Path) -> Vec<String> {
    let krate = file
        .ancestors()
        .skip(1)
        .find(|d| d.join("Cargo.toml").exists())
        .expect("every Rust file is in a crate");
    let rel = file.strip_prefix(krate).expect("under its crate");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    match parts.first().map(String::as_str) {
        Some("src") => {
            parts.remove(0);
            if parts.first().map(String::as_str) == Some("bin") {
                parts.clear();
            }
        }
        Some("tests" | "benches") if parts.len() > 2 => {
            // A test binary in its own folder: `tests/e2e/main.rs` is its root.
            parts.drain(..2);
        }
        Some("tests" | "benches") => {
            parts.remove(0);
        }
        _ => {}
    }
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

struct Walk<'a> {
    file: String,
    items: &'a mut Vec<Item>,
}

impl Walk<'_> {
    fn push(&mut self, module: &[String], name: String, test: bool) {
        let mut path = module.to_vec();
        path.push(name);
        self.items.push(Item {
            path,
            test,
            file: self.file.clone(),
        });
    }

    fn items(&mut self, module: &[String], items: &[syn::Item]) {
        for item in items {
            match item {
                syn::Item::Fn(f) => {
                    let test = f
                        .attrs
                        .iter()
                        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test"));
                    self.push(module, f.sig.ident.to_string(), test);
                }
                syn::Item::Mod(m) => {
                    self.push(module, m.ident.to_string(), false);
                    if let Some((_, inner)) = &m.content {
                        let mut path = module.to_vec();
                        path.push(m.ident.to_string());
                        self.items(&path, inner);
                    }
                }
                syn::Item::Impl(i) => {
                    let syn::Type::Path(ty) = &*i.self_ty else {
                        continue;
                    };
                    let Some(ty) = ty.path.segments.last() else {
                        continue;
                    };
                    let mut path = module.to_vec();
                    path.push(ty.ident.to_string());
                    for inner in &i.items {
                        match inner {
                            syn::ImplItem::Fn(f) => {
                                self.push(&path, f.sig.ident.to_string(), false)
                            }
                            syn::ImplItem::Const(c) => self.push(&path, c.ident.to_string(), false),
                            _ => {}
                        }
                    }
                }
                syn::Item::Struct(s) => self.push(module, s.ident.to_string(), false),
                syn::Item::Enum(e) => {
                    self.push(module, e.ident.to_string(), false);
                    let mut path = module.to_vec();
                    path.push(e.ident.to_string());
                    for v in &e.variants {
                        self.push(&path, v.ident.to_string(), false);
                    }
                }
                syn::Item::Trait(t) => self.push(module, t.ident.to_string(), false),
                syn::Item::Const(c) => self.push(module, c.ident.to_string(), false),
                syn::Item::Static(s) => self.push(module, s.ident.to_string(), false),
                syn::Item::Type(t) => self.push(module, t.ident.to_string(), false),
                syn::Item::Use(u) => {
                    // What a module re-exports can be cited through it (`delta::Held`).
                    let mut names = Vec::new();
                    used_names(&u.tree, &mut names);
                    for name in names {
                        self.push(module, name, false);
                    }
                }
                syn::Item::Macro(m) => {
                    let name = m.mac.path.segments.last().map(|s| s.ident.to_string());
                    if let Some(ident) = &m.ident {
                        self.push(module, ident.to_string(), false);
                    } else if name.as_deref() == Some("proptest") {
                        // Every `fn` in `proptest! { … }` is a test.
                        for f in fns_in(m.mac.tokens.clone()) {
                            self.push(module, f, true);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// The names a `use` brings into its module.
fn used_names(tree: &syn::UseTree, out: &mut Vec<String>) {
    match tree {
        syn::UseTree::Path(p) => used_names(&p.tree, out),
        syn::UseTree::Name(n) => out.push(n.ident.to_string()),
        syn::UseTree::Rename(r) => out.push(r.rename.to_string()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| used_names(t, out)),
        syn::UseTree::Glob(_) => {}
    }
}

/// The names after each `fn` in `tokens`, nested groups included.
fn fns_in(tokens: proc_macro2::TokenStream) -> Vec<String> {
    let mut out = Vec::new();
    let mut after_fn = false;
    for t in tokens {
        match t {
            proc_macro2::TokenTree::Ident(i) if after_fn => {
                out.push(i.to_string());
                after_fn = false;
            }
            proc_macro2::TokenTree::Ident(i) => after_fn = i == "fn",
            proc_macro2::TokenTree::Group(g) => {
                out.extend(fns_in(g.stream()));
                after_fn = false;
            }
            _ => after_fn = false,
        }
    }
    out
}

/// One backticked name in a document, and what it must name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Citation {
    /// `README.md:132`.
    at: String,
    /// As written.
    text: String,
    /// It must be a test (else any item).
    test: bool,
    /// The file or folder it must be in (a cited path before it in its group).
    scope: Option<String>,
}

/// The citations of document `doc` (named `name`).
fn citations(name: &str, doc: &str) -> Vec<Citation> {
    let mut out = Vec::new();
    // Columns of the current table that hold tests.
    let mut test_columns: Option<Vec<bool>> = None;
    // In a "Test:" / "Tests:" paragraph.
    let mut in_tests_prose = false;
    for (i, line) in doc.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        if line.trim().is_empty() {
            in_tests_prose = false;
        }
        if line.starts_with('|') {
            let cells = cells(line);
            if cells.iter().all(|c| c.trim().chars().all(|ch| ch == '-')) {
                continue;
            }
            let columns = test_columns.get_or_insert_with(|| {
                // The header row.
                cells
                    .iter()
                    .map(|c| matches!(c.trim(), "test" | "tests"))
                    .collect()
            });
            let columns = columns.clone();
            for (c, cell) in cells.iter().enumerate() {
                let strict = columns.get(c).copied().unwrap_or(false);
                out.extend(in_text(&at, cell, strict));
            }
            continue;
        }
        test_columns = None;
        match line.find("Tests:").or_else(|| line.find("Test:")) {
            Some(start) if name.ends_with("design.md") => {
                out.extend(in_text(&at, &line[..start], false));
                out.extend(in_text(&at, &line[start..], true));
                in_tests_prose = true;
            }
            _ => out.extend(in_text(&at, line, in_tests_prose)),
        }
    }
    out
}

/// The cells of a table row, split on `|` outside backticks.
fn cells(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut code = false;
    for ch in row
        .trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .chars()
    {
        match ch {
            '`' => {
                code = !code;
                cell.push(ch);
            }
            '|' if !code => cells.push(std::mem::take(&mut cell)),
            _ => cell.push(ch),
        }
    }
    cells.push(cell);
    cells
}

/// The citations in `text`: in `strict` text every name is a test, scoped by the last
/// path cited before it (up to a `;`).
fn in_text(at: &str, text: &str, strict: bool) -> Vec<Citation> {
    let mut out = Vec::new();
    let mut scope: Option<String> = None;
    // Alternates: outside, inside backticks.
    for (n, part) in text.split('`').enumerate() {
        if n % 2 == 0 {
            if part.contains(';') {
                scope = None;
            }
            continue;
        }
        let token = part.trim_end_matches("()");
        let cite = |test, scope| Citation {
            at: at.to_owned(),
            text: token.to_owned(),
            test,
            scope,
        };
        if strict && is_repo_path(token) {
            if token.ends_with(".rs") || token.ends_with('/') {
                scope = Some(token.to_owned());
            }
            out.push(cite(false, None));
        } else if is_module_path(token) {
            out.push(cite(strict, None));
        } else if strict && is_bare_name(token) {
            out.push(cite(true, scope.clone()));
        }
    }
    out
}

/// `proto/src/snapshot.rs`, `tests/tests/e2e/faults/`, `data-plane/fuzz/afl.sh`.
fn is_repo_path(token: &str) -> bool {
    token.contains('/')
        && !token.contains(' ')
        && !token.starts_with('/')
        && !token.contains("://")
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// `a::b::c`, with `…` for left-out parts of the last segment, or a last segment `*`.
fn is_module_path(token: &str) -> bool {
    let segments: Vec<&str> = token.split("::").collect();
    let Some((last, modules)) = segments.split_last() else {
        return false;
    };
    !modules.is_empty()
        && modules.iter().all(|s| is_segment(s))
        && (*last == "*" || is_segment(&last.replace('…', "")))
}

/// A test's name alone (snake case, at least one `_`), possibly abbreviated with `…`.
fn is_bare_name(token: &str) -> bool {
    let name = token.replace('…', "");
    is_segment(&name) && name.contains('_') && name.chars().all(|c| !c.is_ascii_uppercase())
}

/// Whether `name` (an item's last segment) is what `pattern` (a citation's) says: each
/// `…` stands for left-out text (`s02_…`, `…_snapshot`, `s02_…_snapshot`).
fn name_matches(name: &str, pattern: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let (first, rest) = parts.split_first().expect("split gives one part at least");
    let Some(mut left) = name.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for part in middle {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    left.ends_with(last)
}

/// Whether `citation` names something in `items`.
fn resolves(citation: &Citation, items: &[Item]) -> bool {
    let root = repo_root();
    if citation.scope.is_none() && is_repo_path(&citation.text) {
        return root.join(&citation.text).exists();
    }
    let segments: Vec<&str> = citation.text.split("::").collect();
    let (last, modules) = segments.split_last().expect("at least one segment");
    let in_scope = |item: &Item| {
        citation.scope.as_ref().is_none_or(|scope| {
            if scope.ends_with('/') {
                item.file.starts_with(scope.as_str())
            } else {
                item.file == *scope
            }
        })
    };
    let tests_or_items = || {
        items
            .iter()
            .filter(|item| (item.test || !citation.test) && in_scope(item))
    };
    if *last == "*" {
        return tests_or_items()
            .any(|item| item.test && item.path[..item.path.len() - 1].ends_with_segments(modules));
    }
    tests_or_items().any(|item| {
        let (name, item_modules) = item.path.split_last().expect("a name");
        name_matches(name, last) && item_modules.ends_with_segments(modules)
    })
    // A module of tests, cited whole (`translate::tests`).
    || (citation.test && !last.contains('…') && tests_or_items().any(|item| {
        item.test && item.path[..item.path.len() - 1].ends_with_segments(&segments)
    }))
}

trait EndsWithSegments {
    fn ends_with_segments(&self, suffix: &[&str]) -> bool;
}

impl EndsWithSegments for [String] {
    fn ends_with_segments(&self, suffix: &[&str]) -> bool {
        self.len() >= suffix.len()
            && self[self.len() - suffix.len()..]
                .iter()
                .zip(suffix)
                .all(|(a, b)| a == b)
    }
}

/// The documents whose citations are checked: the README and every page of docs/ but the
/// benchmark history.
fn cited_documents() -> Vec<String> {
    let mut docs: Vec<String> = markdown_files()
        .into_iter()
        .map(|path| relative(&path))
        .filter(|name| name != "docs/benchmarks.md" && !name.starts_with("docs/conformance/"))
        .collect();
    docs.sort();
    docs
}

/// A path relative to the repository root, with `/` between its parts.
fn relative(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .expect("under the root")
        .to_string_lossy()
        .into_owned()
}

/// The citations of the cited documents that name nothing.
fn dangling(items: &[Item]) -> (usize, Vec<Citation>) {
    let mut all = Vec::new();
    for doc in cited_documents() {
        let text = std::fs::read_to_string(repo_root().join(&doc)).expect("the document");
        all.extend(citations(&doc, &text));
    }
    let total = all.iter().filter(|c| c.test).count();
    let missing = all.into_iter().filter(|c| !resolves(c, items)).collect();
    (total, missing)
}

/// The README and every Markdown file under docs/, at any depth.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("a readable directory")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![repo_root().join("README.md")];
    walk(&repo_root().join("docs"), &mut out);
    out
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors of a Markdown text's headings, as GitHub makes them: lower case, letters,
/// digits, `_`, `-` and spaces kept, spaces made `-`; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let Some(title) = line[hashes..]
            .strip_prefix(' ')
            .filter(|_| (1..=6).contains(&hashes))
        else {
            continue;
        };
        let base: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of a Markdown text's links, `[text](target)`, outside fenced code.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                let target = &rest[..end];
                if !target.is_empty() && !target.contains(char::is_whitespace) {
                    out.push(target.to_owned());
                }
            }
        }
    }
    out
}

/// The links of `text` (a document in `dir`) that lead nowhere: to a file that does not
/// exist, or to a heading a Markdown file does not have. Links with a scheme (`https:`)
/// are not followed. Returns how many links were checked, and the broken ones.
fn broken_links(dir: &Path, own: &str, text: &str) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut broken = Vec::new();
    for target in link_targets(text) {
        let scheme = target.split_once(':').is_some_and(|(s, _)| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')
        });
        if scheme {
            continue;
        }
        checked += 1;
        let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let page = if file.is_empty() {
            Some(own.to_owned())
        } else {
            let path = dir.join(file);
            if !path.exists() {
                broken.push(format!("{target}: no such file"));
                continue;
            }
            file.ends_with(".md")
                .then(|| std::fs::read_to_string(&path).expect("a readable document"))
        };
        if let (Some(page), false) = (page, anchor.is_empty())
            && !anchors(&page).contains(anchor)
        {
            broken.push(format!("{target}: no such heading"));
        }
    }
    (checked, broken)
}

#[test]
fn every_test_the_readme_and_the_docs_cite_exists() {
    let items = index();
    let tests = items.iter().filter(|i| i.test).count();
    assert!(tests > 250, "only {tests} tests found: the index is broken");
    let (cited, missing) = dangling(&items);
    eprintln!("{cited} test citations checked against {tests} tests");
    // Not vacuous: the guarantee tables alone cite well over a hundred tests.
    assert!(cited > 150, "only {cited} test citations found");
    let list: BTreeMap<String, String> = missing
        .iter()
        .map(|c| {
            (
                format!("{} `{}`", c.at, c.text),
                c.scope.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} citations name nothing (renamed or moved?):\n{list:#?}",
        missing.len()
    );
}

/// The check itself: a renamed test, a wrong module and a file that does not hold the
/// test are caught; the abbreviations resolve.
#[test]
fn a_renamed_or_misplaced_test_is_caught() {
    let items = index();
    let cite = |text: &str, scope: Option<&str>| Citation {
        at: "here".into(),
        text: text.into(),
        test: true,
        scope: scope.map(str::to_owned),
    };
    for ok in [
        cite("docs::a_renamed_or_misplaced_test_is_caught", None),
        cite("docs::a_renamed_or_misplaced_…", None),
        cite("…renamed_or_misplaced_test_is_caught", None),
        cite("docs::a_…_misplaced_…_caught", None),
        cite("proxy::balance::tests::*", None),
        cite("proxy::balance::tests", None),
        cite(
            "a_renamed_or_misplaced_test_is_caught",
            Some("tests/tests/e2e/"),
        ),
        cite(
            "a_renamed_or_misplaced_test_is_caught",
            Some("tests/tests/e2e/docs.rs"),
        ),
    ] {
        assert!(resolves(&ok, &items), "{ok:?} does not resolve");
    }
    for wrong in [
        cite("docs::a_renamed_or_misplaced_test_is_caught_now", None),
        cite("docs::tests::a_renamed_or_misplaced_test_is_caught", None),
        cite("faults::a_renamed_or_misplaced_…", None),
        cite("docs::a_…_misplaced_…_caught_now", None),
        cite(
            "a_renamed_or_misplaced_test_is_caught",
            Some("tests/tests/e2e/faults/"),
        ),
        cite("docs::index", None),
        cite("no_such_module::tests::*", None),
        cite(
            "proxy::tests::local_connect_errors_are_told_from_the_endpoints_own",
            None,
        ),
    ] {
        assert!(!resolves(&wrong, &items), "{wrong:?} resolves");
    }
    // `docs::index` is an item, though not a test.
    let mut any = cite("docs::index", None);
    any.test = false;
    assert!(resolves(&any, &items));
    // And how a document is read: a test column, a "Tests:" paragraph with its paths.
    let doc = "| a | tests |\n| --- | --- |\n| `x::y` | `m::t`, `bare_name` |\n\nSee `p::q`. Tests: `a/b.rs` `one_two`; `three_four`.\n";
    let found: Vec<(String, bool, Option<String>)> = citations("docs/design.md", doc)
        .into_iter()
        .map(|c| (c.text, c.test, c.scope))
        .collect();
    assert_eq!(
        found,
        [
            ("x::y".into(), false, None),
            ("m::t".into(), true, None),
            ("bare_name".into(), true, None),
            ("p::q".into(), false, None),
            ("a/b.rs".into(), false, None),
            ("one_two".into(), true, Some("a/b.rs".into())),
            ("three_four".into(), true, None),
        ]
    );
}

#[test]
fn every_link_in_the_readme_and_the_docs_resolves() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for path in markdown_files() {
        let text = std::fs::read_to_string(&path).expect("a readable document");
        let dir = path.parent().expect("a directory");
        let (n, bad) = broken_links(dir, &text, &text);
        checked += n;
        broken.extend(bad.into_iter().map(|b| format!("{}: {b}", relative(&path))));
    }
    // Not vacuous: the README alone links to every page of docs/ and to a test per guarantee.
    assert!(
        checked > 60,
        "only {checked} links found: the reader is broken"
    );
    assert!(
        broken.is_empty(),
        "{} links lead nowhere:\n{broken:#?}",
        broken.len()
    );
}

/// The check itself: a missing file, a missing heading (here or in another page) and a
/// repeated heading's anchor are told apart from links that resolve.
#[test]
fn a_link_to_a_missing_file_or_heading_is_caught() {
    let own = "# Title\n\n## A `code` heading: here\n\n## Twice\n\n## Twice\n\n```md\n[not a link](nowhere.md)\n```\n";
    let text = format!(
        "{own}[ok](docs/design.md) [ok](#a-code-heading-here) [ok](#twice-1) [ok](https://example.com/x) \
         [ok](tests/run.sh) [bad](docs/nothing.md) [bad](#twice-2) [bad](docs/design.md#no-such-heading)"
    );
    let (checked, broken) = broken_links(&repo_root(), &text, &text);
    assert_eq!(checked, 7);
    assert_eq!(
        broken,
        [
            "docs/nothing.md: no such file",
            "#twice-2: no such heading",
            "docs/design.md#no-such-heading: no such heading",
        ]
    );
}

/// The README is the first screen: what holdfast is, the two commands, the guarantees
/// and where the rest is; the rest lives in docs/.
#[test]
fn the_readme_stays_under_250_lines() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("the README");
    let lines = readme.lines().count();
    assert!(lines > 50, "only {lines} lines: the README was not read");
    assert!(
        lines < 250,
        "the README has {lines} lines; move detail into docs/"
    );
}
