//! The fsync floor (scenario 2's baseline): what one durable append costs on the disk the
//! brokers write to, measured in the same run. A durable broker cannot acknowledge a
//! delta faster than a raw NATS hop plus one `fdatasync`, so scenario 2's p50 is judged
//! against their sum.

use std::io::Write as _;

use super::*;

/// The bytes of one timed append: about one group commit of a few small events.
pub(crate) const APPEND: usize = 4096;

/// Appends `n` blocks of [`APPEND`] bytes to a new file in `dir` (the bench's data dirs'
/// filesystem), each followed by `fdatasync`, back to back, and returns each append +
/// sync's time in ms, sorted. Every append grows the file, so each sync also writes its
/// new size, as a log segment's does.
pub(crate) fn fdatasync_ms(dir: &Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut floor = Floor::create(dir)?;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        floor.append()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    floor.remove(ms)
}

/// An ideal durable broker on the same disk, at the timed deltas' pace: `n` arrivals at
/// `rate` per second (an absolute schedule, as the harness sends them), made durable by a
/// group commit with no other work (one [`APPEND`] + `fdatasync` for everything that
/// arrived since the last). Returns each arrival's time until its sync ended, in ms,
/// sorted. Paced over seconds, this shows the disk's own stalls (on the machine of
/// ops/BENCHMARKS.md, one of 3-12 ms about every 1.5 s) and what waits behind them,
/// which a burst of a fraction of a second misses: the floor of the delta latency's tail.
pub(crate) fn group_commit_ms(dir: &Path, n: usize, rate: f64) -> anyhow::Result<Vec<f64>> {
    let mut floor = Floor::create(dir)?;
    // Arrivals not yet synced, and whether the last has come.
    let waiting = (
        std::sync::Mutex::new((Vec::<Instant>::new(), false)),
        std::sync::Condvar::new(),
    );
    let mut ms = Vec::with_capacity(n);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        scope.spawn(|| {
            let start = Instant::now();
            for i in 0..n {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if let Ok(mut w) = waiting.0.lock() {
                    w.0.push(due);
                }
                waiting.1.notify_one();
            }
            if let Ok(mut w) = waiting.0.lock() {
                w.1 = true;
            }
            waiting.1.notify_one();
        });
        loop {
            let group = {
                let mut w = waiting
                    .0
                    .lock()
                    .map_err(|_| anyhow::anyhow!("the arrivals panicked"))?;
                while w.0.is_empty() && !w.1 {
                    w = waiting
                        .1
                        .wait(w)
                        .map_err(|_| anyhow::anyhow!("the arrivals panicked"))?;
                }
                if w.0.is_empty() {
                    return Ok(());
                }
                std::mem::take(&mut w.0)
            };
            floor.append()?;
            let synced = Instant::now();
            ms.extend(
                group
                    .iter()
                    .map(|due| synced.duration_since(*due).as_secs_f64() * 1e3),
            );
        }
    })?;
    floor.remove(ms)
}

/// The floor's file, made and synced untimed.
struct Floor {
    path: PathBuf,
    file: std::fs::File,
    block: Vec<u8>,
}

impl Floor {
    fn create(dir: &Path) -> anyhow::Result<Floor> {
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
        Ok(Floor { path, file, block })
    }

    /// One timed append: a block, then `fdatasync`.
    fn append(&mut self) -> anyhow::Result<()> {
        self.file.write_all(&self.block)?;
        Ok(self.file.sync_data()?)
    }

    /// Removes the file; `ms`, sorted.
    fn remove(self, mut ms: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        drop(self.file);
        std::fs::remove_file(&self.path)?;
        ms.sort_by(|a, b| a.total_cmp(b));
        Ok(ms)
    }
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
