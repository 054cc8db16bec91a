//! The shape of the crate, checked from its source: which module uses which (`crate::x`
//! paths outside test code). No circle of imports; the plugin's core (state decided at init)
//! does not reach into comms and connections; the libfabric layer and the drivers know
//! nothing of NCCL's objects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A file's code outside its tests (test code may use anything).
fn outside_tests(text: &str) -> &str {
    text.split("#[cfg(test)]").next().unwrap_or("")
}

/// Module name → the modules it uses (a folder module's files together, each without its
/// tests).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut text: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if path.join("mod.rs").exists() {
                let mut all = String::new();
                for f in std::fs::read_dir(&path).expect("module folder") {
                    let file = std::fs::read_to_string(f.expect("file").path()).unwrap_or_default();
                    all += outside_tests(&file);
                }
                text.insert(name, all);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            let file = std::fs::read_to_string(&path).expect("read");
            text.insert(name, outside_tests(&file).to_string());
        }
    }
    let names: BTreeSet<String> = text.keys().cloned().collect();
    text.iter()
        .map(|(m, code)| {
            let uses = code
                .match_indices("crate::")
                .filter_map(|(i, _)| {
                    let rest = &code[i + 7..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                        .unwrap_or(rest.len());
                    let used = &rest[..end];
                    (names.contains(used) && used != m).then(|| used.to_string())
                })
                .collect();
            (m.clone(), uses)
        })
        .collect()
}

#[test]
fn no_module_imports_itself_through_others() {
    let g = graph();
    assert!(g.len() > 20, "modules found: {:?}", g.keys());
    // Depth-first search for a back edge.
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for n in &g[m] {
            match state.get(n.as_str()) {
                Some(1) => panic!("circle of imports: {} -> {n}", path.join(" -> ")),
                Some(_) => {}
                None => visit(n, g, state, path),
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if !state.contains_key(m.as_str()) {
            visit(m, &g, &mut state, &mut Vec::new());
        }
    }
}

/// The layers, bottom up: every module of `src/` is in exactly one, and uses only modules
/// of the layers below its own (lib.rs describes them).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "C types and the system",
        &[
            "sys", "nccl", "random", "nic", "tags", "overflow", "wake", "times", "sizing", "pace",
        ],
    ),
    (
        "errors and logging; what NCCL decided about GPU buffers",
        &["error", "log", "gdr"],
    ),
    (
        "settings, NCCL's pointers, libfabric objects",
        &["settings", "opaque", "fabric"],
    ),
    (
        "what peer addresses must look like; what providers need",
        &["address", "quirks"],
    ),
    (
        "endpoints; wire records; the provider policy",
        &["endpoint", "handshake", "provider"],
    ),
    ("where control endpoints live", &["control_domain"]),
    ("discovery; operations", &["discover", "op"]),
    ("the one reader of an endpoint's queue", &["driver"]),
    ("who drives endpoints", &["progress", "control"]),
    ("lanes", &["lane"]),
    ("devices; comms and requests", &["device", "comm"]),
    ("state decided at init; registrations", &["plugin", "mr"]),
    ("listen, connect and accept", &["connection"]),
    ("the exported tables", &["exports"]),
];

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let g = graph();
    let layer_of = |m: &str| LAYERS.iter().position(|(_, ms)| ms.contains(&m));
    for m in g.keys() {
        assert!(
            layer_of(m).is_some(),
            "module {m} is in no layer of LAYERS: place it there"
        );
    }
    for (_, ms) in LAYERS {
        for m in *ms {
            assert!(
                g.contains_key(*m),
                "LAYERS names {m}, which src/ does not have"
            );
        }
    }
    for (m, uses) in &g {
        let mine = layer_of(m).unwrap();
        for n in uses {
            let theirs = layer_of(n).unwrap();
            assert!(
                theirs < mine,
                "{m} ({}) uses {n} ({}), which is not below it",
                LAYERS[mine].0,
                LAYERS[theirs].0
            );
        }
    }
}
