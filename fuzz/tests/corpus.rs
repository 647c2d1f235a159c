//! Every committed corpus input of every fuzz target, replayed through the
//! target as an ordinary test, so CI covers the corpus without libFuzzer.

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for (name, target) in keel_fuzz::TARGETS {
        for dir in [root.join("corpus").join(name), root.join("regressions").join(name)] {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            let mut files: Vec<_> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
            files.sort();
            for file in files {
                let data = std::fs::read(&file).unwrap();
                let outcome = std::panic::catch_unwind(|| target(&data));
                assert!(outcome.is_ok(), "{name}: {} fails", file.display());
                replayed += 1;
            }
        }
    }
    eprintln!("replayed {replayed} corpus inputs");
}

/// Inputs a fuzzer starts from (empty, tiny, all-zero, all-ones, a ramp)
/// through every target.
#[test]
fn small_inputs_pass_every_target() {
    for (name, target) in keel_fuzz::TARGETS {
        let started = std::time::Instant::now();
        for len in [0usize, 1, 2, 16, 255] {
            for fill in [0u8, 0xff] {
                target(&vec![fill; len]);
            }
            target(&(0..len).map(|i| i as u8).collect::<Vec<_>>());
        }
        eprintln!("{name}: {:?}", started.elapsed());
    }
}
