//! Asking the kernel to forget dataset files' names when metadata outgrows the memory budget.
//!
//! Owns: one thread (`prepfs-forget`) that, while the budget is over its limit or under memory
//! pressure (checked every `EVERY`, and at once when the budget sheds), tells the kernel to drop
//! its entries for up to half of the dataset files the inode table holds, oldest first
//! (`Fs::forgettable`). The kernel answers with FORGETs for those no one uses, the table lets go
//! of them and their charge, and a later lookup makes them again (one stat of the source). So an
//! ImageNet-size walk costs the daemon a bounded table, not one node per file ever looked up.
//! Must never run on a FUSE thread (an invalidation waits for the directory's lock, which a
//! lookup in flight holds) and never block the budget: a shed only rings the thread.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fuser::{INodeNo, Notifier};

use crate::fs::Fs;
use crate::memory::Shed;

/// How often the budget is looked at (a few atomic loads): a walk of long paths adds up to
/// ~20 MB of names a second on this kind of machine, and the headroom beyond the budget is
/// 64 MiB, so the kernel is asked to forget within a tenth of a second of the budget filling.
const EVERY: Duration = Duration::from_millis(100);

/// Rings the forgetting thread; it stops once this is dropped.
pub struct Forgetter {
    ring: SyncSender<()>,
}

impl Shed for Forgetter {
    fn shed(&self) -> u64 {
        let _ = self.ring.try_send(());
        // The memory comes back as the kernel's FORGETs arrive, not now.
        0
    }
}

impl Forgetter {
    /// Starts the thread for `fs`, invalidating through `notifier`; registered with the budget
    /// as something that can shed.
    pub fn start(notifier: Notifier, fs: Weak<Fs>) -> std::io::Result<Arc<Forgetter>> {
        let (ring, rung) = sync_channel(1);
        std::thread::Builder::new()
            .name("prepfs-forget".into())
            .spawn(move || run(&notifier, &fs, &rung))?;
        Ok(Arc::new(Forgetter { ring }))
    }
}

fn run(notifier: &Notifier, fs: &Weak<Fs>, rung: &Receiver<()>) {
    loop {
        let shed = match rung.recv_timeout(EVERY) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(fs) = fs.upgrade() else { return };
        let gauges = fs.memory().gauges();
        let used: u64 = gauges.used.iter().sum();
        if !(shed || gauges.pressure || used > gauges.limit) {
            continue;
        }
        let names = fs.forgettable();
        let mut asked = 0u64;
        for (parent, name) in &names {
            // ENOENT: the kernel holds no entry by that name any more; nothing to do.
            if notifier.inval_entry(INodeNo(*parent), name).is_ok() {
                asked += 1;
            }
        }
        fs.metrics().forget_asks.add(asked);
        if asked > 0 {
            tracing::info!(
                names = asked,
                "metadata over the memory budget: the kernel asked to forget dataset files' names"
            );
        }
    }
}
