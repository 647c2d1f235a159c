//! openraft's `AsyncRuntime` on madsim, so the same Raft code runs in the
//! deterministic simulation: tasks, sleeps and openraft's RNG come from
//! madsim; oneshot channels are tokio's (they need no runtime).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::async_runtime::{AsyncRuntime, TokioOneShotSender};
use openraft::{OptionalSend, TokioInstant};

/// openraft's runtime under `cfg(madsim)`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MadsimRuntime;

pin_project_lite::pin_project! {
    /// A future that fails with `Elapsed` once its deadline passes
    /// (`madsim::time::timeout` returns an unnameable type).
    pub struct Timeout<F> {
        #[pin]
        future: F,
        #[pin]
        sleep: madsim::time::Sleep,
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Futures larger than this, in bytes, are boxed before they are spawned.
const SPAWNED_INLINE_BYTES_MAX: usize = 1024;

/// A [`Timeout`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

impl AsyncRuntime for MadsimRuntime {
    type JoinError = madsim::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = madsim::task::JoinHandle<T>;
    type Sleep = madsim::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T>;
    type ThreadLocalRng = madsim::rand::GlobalRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        // madsim moves a spawned future several times before it first runs
        // (into its wrapper, then into the task): a large one goes boxed,
        // so that only a pointer moves.
        if std::mem::size_of::<T>() > SPAWNED_INLINE_BYTES_MAX {
            madsim::task::spawn(Box::pin(future))
        } else {
            madsim::task::spawn(future)
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        madsim::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        madsim::time::sleep_until(deadline.into_std())
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        Timeout { future, sleep: madsim::time::sleep(duration) }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        let now = TokioInstant::now();
        let remaining = if deadline > now { deadline - now } else { Duration::ZERO };
        Self::timeout(remaining, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        madsim::rand::thread_rng()
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(sender), receiver)
    }
}
