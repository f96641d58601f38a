//! The fsync floor (scenario 2's baseline): what one durable append costs on the disk the
//! brokers write to, measured in the same run. A durable broker cannot acknowledge a
//! delta faster than a raw NATS hop plus one `fdatasync`, so scenario 2's p50 is judged
//! against their sum.

use std::io::Write as _;

use super::*;

/// The bytes of one timed append: about one group commit of a few small events.
pub(crate) const APPEND: usize = 4096;

/// Appends `n` blocks of [`APPEND`] bytes to a new file in `dir` (the bench's data dirs'
/// filesystem), each followed by `fdatasync`, and returns each append + sync's time in ms,
/// sorted. Every append grows the file, so each sync also writes its new size, as a log
/// segment's does.
pub(crate) fn fdatasync_ms(dir: &Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let path = dir.join("fsync-floor.bin");
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let block = vec![b'x'; APPEND];
    // The file's creation is not an append: sync it (and its directory entry) untimed.
    file.write_all(&block)?;
    file.sync_all()?;
    std::fs::File::open(dir)?.sync_all()?;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(file);
    std::fs::remove_file(&path)?;
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms)
}

/// The filesystem `dir` is on, from /proc/self/mounts (the longest mount point above
/// it): what the floor measured (a tmpfs syncs nothing).
pub(crate) fn filesystem_of(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, point, kind) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(point)
                .then(|| (point.len(), format!("{kind} ({dev} on {point})")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
        .unwrap_or_else(|| "unknown".into())
}
