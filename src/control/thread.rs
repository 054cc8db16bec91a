//! The process's one control thread: the mailbox other threads hand it jobs through, and
//! its loop, which turns every control endpoint's station, finishes adopted endpoints and
//! runs chores when they are due.

use super::*;

pub(super) enum Job {
    Attach(Box<Station>),
    Send {
        control: Arc<Control>,
        to: Vec<u8>,
        record: Record,
        purpose: Purpose,
    },
    Adopt(Box<Driver>, Instant),
    Flush,
    Later(Instant, Chore),
}

/// Work the control thread runs at a given time (see [`later`]).
pub type Chore = Box<dyn FnOnce() + Send>;

pub(super) struct Mailbox {
    jobs: Mutex<VecDeque<Job>>,
    hurry_until: AtomicU64,
    thread: OnceLock<Thread>,
}

impl Mailbox {
    pub(super) fn push(&self, job: Job) {
        self.jobs.lock().push_back(job);
        self.wake();
    }
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
    fn take(&self) -> VecDeque<Job> {
        std::mem::take(&mut *self.jobs.lock())
    }
}

/// The process's control thread, started on first use.
pub(super) fn mailbox() -> &'static Mailbox {
    static MAILBOX: OnceLock<Mailbox> = OnceLock::new();
    static STARTED: std::sync::Once = std::sync::Once::new();
    let mb = MAILBOX.get_or_init(|| Mailbox {
        jobs: Mutex::new(VecDeque::new()),
        hurry_until: AtomicU64::new(0),
        thread: OnceLock::new(),
    });
    STARTED.call_once(|| {
        match std::thread::Builder::new()
            .name("nfab-control".into())
            .spawn(|| run(mailbox()))
        {
            Ok(h) => {
                let _ = mb.thread.set(h.thread().clone());
            }
            Err(e) => {
                tracing::warn!("could not start the control thread ({e}): connects will time out")
            }
        }
    });
    mb
}

/// Keeps the control thread polling fast for a while: a handshake is under way.
pub fn hurry() {
    let mb = mailbox();
    mb.hurry_until.store(now_ms() + HURRY_MS, Ordering::Release);
    mb.wake();
}

/// Hands the control thread the driver of a retired endpoint that the provider still holds
/// operations on: it keeps cancelling and reading completions, and closes the endpoint once
/// nothing is left in flight, or at `deadline` regardless.
pub fn adopt(driver: Driver, deadline: Instant) {
    mailbox().push(Job::Adopt(Box::new(driver), deadline));
}

/// Runs `chore` on the control thread once `delay` has passed (within its tick, ~20 ms).
pub fn later(delay: Duration, chore: Chore) {
    mailbox().push(Job::Later(Instant::now() + delay, chore));
}

/// At the last finalize: every adopted endpoint closes within `FLUSH_WAIT`, once its sinks
/// have been quiet for a moment, without finalize waiting for it (a communicator made right
/// after must not pay for the last one's leftovers).
pub fn flush() {
    mailbox().push(Job::Flush);
}

fn run(mb: &'static Mailbox) {
    let mut stations: Vec<Box<Station>> = Vec::new();
    let mut adopted: Vec<(Driver, Instant)> = Vec::new();
    let mut chores: Vec<(Instant, Chore)> = Vec::new();
    let body = std::panic::AssertUnwindSafe(|| loop {
        for job in mb.take() {
            match job {
                Job::Attach(s) => stations.push(s),
                Job::Send {
                    control,
                    to,
                    record,
                    purpose,
                } => match stations
                    .iter_mut()
                    .find(|s| Arc::ptr_eq(&s.control, &control))
                {
                    Some(s) => s.send(&to, &record, purpose),
                    None => purpose.failed("no control endpoint".into()),
                },
                Job::Adopt(d, deadline) => adopted.push((*d, deadline)),
                Job::Later(at, chore) => chores.push((at, chore)),
                Job::Flush => {
                    let by = Instant::now() + FLUSH_WAIT;
                    for (_, deadline) in &mut adopted {
                        *deadline = (*deadline).min(by);
                    }
                }
            }
        }
        let mut busy = false;
        for s in &mut stations {
            busy |= s.turn();
        }
        let now = Instant::now();
        let mut i = 0;
        while i < adopted.len() {
            let (d, deadline) = &mut adopted[i];
            if d.wind_down(SINKS_QUIET) || now >= *deadline {
                let (d, _) = adopted.swap_remove(i);
                close_adopted(d);
            } else {
                i += 1;
            }
        }
        busy |= !adopted.is_empty();
        let mut i = 0;
        while i < chores.len() {
            if now >= chores[i].0 {
                let chore = chores.swap_remove(i).1;
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(chore)).is_err() {
                    tracing::warn!("a timed chore of the control thread failed (a plugin bug)");
                }
            } else {
                i += 1;
            }
        }
        let nap = if now_ms() < mb.hurry_until.load(Ordering::Acquire) {
            Duration::from_micros(20)
        } else if busy {
            Duration::from_micros(500)
        } else {
            Duration::from_millis(20)
        };
        std::thread::park_timeout(nap);
    });
    if std::panic::catch_unwind(body).is_err() {
        tracing::warn!("the control thread stopped (a plugin bug): connects will time out");
    }
}

fn close_adopted(mut d: Driver) {
    if !d.empty() {
        tracing::debug!(
            "closing an endpoint with {} operation(s) the provider still held",
            d.in_flight()
        );
        d.cancel_all(true);
        let _ = d.turn();
    }
    d.finish();
}
