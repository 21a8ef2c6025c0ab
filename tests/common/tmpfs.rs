//! A real filesystem that fills up: a tmpfs of a few MiB mounted for a test (it needs root, as
//! the test command has in CI), and a filler file. Shared by the relay's tests
//! (`tests/common`) and the actors' (`actors/tests/it`, which include this file by path).

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// A tmpfs mounted on a temporary directory; unmounted on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (the test says it is skipped) when not root: mounting needs it. As root, a mount
    /// that fails fails the test.
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let uid = Command::new("id").arg("-u").output().expect("id -u");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            eprintln!("SKIPPED: mounting a tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount")
            .success();
        assert!(ok, "mount -t tmpfs failed (root, but no mount permission?)");
        Some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Writes zeros to `path` until the filesystem is full.
pub fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        if f.write_all(&block).is_err() {
            break;
        }
    }
    // What a smaller write still fits, so not a page is left.
    for _ in 0..64 {
        let _ = f.write_all(&block[..1024]);
    }
}
