//! One way for a test to wait on the world: poll a check until it holds, or fail after a budget
//! naming what was awaited and the last thing the check saw. Owns no state and never retries past
//! its budget by more than one poll.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use kube::{Api, Resource};
use serde::{Serialize, de::DeserializeOwned};

/// How often [`eventually`] polls.
pub const POLL: Duration = Duration::from_millis(100);

/// What one poll of a check found: the awaited value, or not yet.
///
/// A check returns `Option<T>` (`None`: not yet, nothing to show) or `Result<T, String>` (`Err`:
/// not yet, and the text says what it saw instead, which the timeout message repeats).
pub trait Poll {
    /// The value the wait returns once the check holds.
    type Value;

    /// `Ok` with the value once the check holds, else `Err` with what the check saw.
    fn poll(self) -> Result<Self::Value, String>;
}

impl<T> Poll for Option<T> {
    type Value = T;

    fn poll(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing (the check returned None)".to_string())
    }
}

impl<T> Poll for Result<T, String> {
    type Value = T;

    fn poll(self) -> Result<T, String> {
        self
    }
}

/// Polls `check` every [`POLL`] until it holds and returns its value, or panics after `budget`
/// with "timed out after {budget} waiting for {what}; last seen: {what the last poll saw}".
pub async fn eventually<P: Poll>(
    what: &str,
    budget: Duration,
    check: impl AsyncFnMut() -> P,
) -> P::Value {
    eventually_every(what, budget, POLL, check).await
}

/// [`eventually`], polling every `every` instead of every [`POLL`].
pub async fn eventually_every<P: Poll>(
    what: &str,
    budget: Duration,
    every: Duration,
    check: impl AsyncFnMut() -> P,
) -> P::Value {
    Wait::within(budget).every(every).until(what, check).await
}

/// How a test waits: for at most a budget, polling every so often, and whether it prints how long
/// the wait took. For a test that waits the same way many times:
/// `const WAIT: Wait = Wait::within(Duration::from_secs(60)).every(Duration::from_millis(200));`.
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    budget: Duration,
    every: Duration,
    timed: bool,
}

impl Wait {
    /// At most `budget`, polling every [`POLL`], printing nothing.
    pub const fn within(budget: Duration) -> Self {
        Self {
            budget,
            every: POLL,
            timed: false,
        }
    }

    /// Polling every `every` instead.
    pub const fn every(self, every: Duration) -> Self {
        Self { every, ..self }
    }

    /// Printing "{what}: {how long it took}" once the check holds.
    pub const fn timed(self) -> Self {
        Self {
            timed: true,
            ..self
        }
    }

    /// Polls `check` until it holds and returns its value, or panics once the budget is spent
    /// with "timed out after {budget} waiting for {what}; last seen: {what the last poll saw}".
    pub async fn until<P: Poll>(self, what: &str, check: impl AsyncFnMut() -> P) -> P::Value {
        let start = Instant::now();
        match self.poll(check).await {
            Ok(value) => self.done(what, start, value),
            Err(last) => self.timed_out(what, &last),
        }
    }

    /// [`Wait::until`], the timeout message showing what `seen` reads instead of what the last
    /// poll saw: for a check whose failure is best explained by something it does not read
    /// itself. `seen` is read once, after the budget is spent, never at a poll.
    pub async fn until_seeing<P: Poll>(
        self,
        what: &str,
        check: impl AsyncFnMut() -> P,
        seen: impl AsyncFnOnce() -> String,
    ) -> P::Value {
        let start = Instant::now();
        match self.poll(check).await {
            Ok(value) => self.done(what, start, value),
            Err(_) => self.timed_out(what, &seen().await),
        }
    }

    /// The check's value once it holds, or what the last poll saw once the budget is spent.
    async fn poll<P: Poll>(self, mut check: impl AsyncFnMut() -> P) -> Result<P::Value, String> {
        let deadline = Instant::now() + self.budget;
        loop {
            match check().await.poll() {
                Ok(value) => return Ok(value),
                Err(last) if Instant::now() >= deadline => return Err(last),
                Err(_) => tokio::time::sleep(self.every).await,
            }
        }
    }

    fn done<T>(self, what: &str, start: Instant, value: T) -> T {
        if self.timed {
            println!("{what}: {:.1?}", start.elapsed());
        }
        value
    }

    fn timed_out(self, what: &str, last: &str) -> ! {
        panic!(
            "timed out after {:?} waiting for {what}; last seen: {last}",
            self.budget
        )
    }
}

/// Reads `name` from `api` every [`POLL`] until `check` holds for it and returns it, or panics
/// after `budget` naming `what` and the object's last status.
pub async fn object_until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    budget: Duration,
    check: impl Fn(&K) -> bool,
) -> K
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    eventually(what, budget, async || {
        let obj = api.get(name).await.expect("the object is readable");
        if check(&obj) {
            Ok(obj)
        } else {
            Err(format!("status of {name}: {}", status(&obj)))
        }
    })
    .await
}

/// The `status` of `obj` as indented JSON, or `none` when it has none yet.
fn status(obj: &impl Serialize) -> String {
    match serde_json::to_value(obj) {
        Ok(serde_json::Value::Object(mut fields)) => match fields.remove("status") {
            Some(status) => serde_json::to_string_pretty(&status).unwrap_or_default(),
            None => "none".to_string(),
        },
        Ok(other) => other.to_string(),
        Err(e) => format!("(not serializable: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_check_holds() {
        let mut polls = 0;
        let value = eventually_every(
            "the third poll",
            Duration::from_secs(5),
            Duration::ZERO,
            async || {
                polls += 1;
                (polls == 3).then_some(polls)
            },
        )
        .await;
        assert_eq!(value, 3);
    }

    /// The message `wait` panics with, run to its end on a runtime of its own.
    fn panic_of<T>(wait: impl Future<Output = T>) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(wait);
        }))
        .expect_err("the wait times out");
        panic
            .downcast_ref::<String>()
            .expect("the panic carries a formatted message")
            .clone()
    }

    #[test]
    fn the_timeout_names_what_and_the_last_thing_seen() {
        let mut polls = 0;
        let message = panic_of(eventually_every(
            "the widget to be Ready",
            Duration::from_millis(30),
            Duration::from_millis(5),
            async || -> Result<(), String> {
                polls += 1;
                Err(format!("poll {polls}: Pending"))
            },
        ));
        assert!(
            message.starts_with(
                "timed out after 30ms waiting for the widget to be Ready; last seen: poll "
            ),
            "{message}"
        );
        assert!(message.ends_with(": Pending"), "{message}");
    }

    #[test]
    fn until_seeing_shows_what_seen_reads_once_after_the_budget() {
        let mut seen_reads = 0;
        let message = panic_of(
            Wait::within(Duration::from_millis(20))
                .every(Duration::from_millis(5))
                .until_seeing(
                    "a value",
                    async || None::<()>,
                    async || {
                        seen_reads += 1;
                        format!("status read {seen_reads} time(s)")
                    },
                ),
        );
        assert_eq!(
            message,
            "timed out after 20ms waiting for a value; last seen: status read 1 time(s)"
        );
    }

    #[test]
    fn an_option_check_says_it_saw_nothing() {
        let message = panic_of(eventually_every(
            "a value",
            Duration::ZERO,
            Duration::ZERO,
            async || None::<()>,
        ));
        assert_eq!(
            message,
            "timed out after 0ns waiting for a value; last seen: nothing (the check returned None)"
        );
    }
}
