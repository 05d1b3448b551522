//! Writes the shared channel vectors to tests/vectors/channel/ (or the directory given as the
//! first argument). `cargo test -p vtism-proto --test vectors` fails if the committed files differ.

#[path = "../tests/support/vectors.rs"]
mod vectors;

use std::fs;
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(vectors::vectors_dir);
    fs::create_dir_all(&dir)?;
    // Remove regions no longer generated, so the directory is exactly the generator's output.
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "bin") {
            fs::remove_file(&path)?;
        }
    }
    let (file, bins) = vectors::generate();
    for (name, bytes) in &bins {
        fs::write(dir.join(name), bytes)?;
    }
    fs::write(dir.join("vectors.json"), vectors::to_json(&file))?;
    println!("wrote {} vectors to {}", bins.len(), dir.display());
    Ok(())
}
