//! Group commit: concurrent writes share one transaction, hence one fsync (SQLite) or
//! one commit round trip (PostgreSQL), whatever the backend.
//!
//! [`CommitQueue`] sits in front of a store (the store front of `front` owns one). Every
//! procedure is queued for one writer task, which takes everything waiting (up to
//! [`MAX_BATCH`]), runs the procedures one after the other in a single transaction
//! (through a `batch_tx::BatchTx`: their replay marks recorded first in one statement,
//! what they write alike sent once at the end, their events last), commits once, and
//! only then answers each caller with its own outcome. So an answer still means
//! "durable": nobody hears back before the commit that holds their write.
//!
//! Why it is safe: a procedure never needs a rollback (a refusal changes only the replay
//! mark, see `rules`), so procedures of different requests can share a transaction; each
//! sees the ones before it (two writes of one user in one batch apply in arrival
//! order, quota and replay marks included). Procedures run ordered by the user row they
//! lock, so batches of several instances on PostgreSQL take row locks in one order and
//! cannot deadlock; the events (and PostgreSQL's events lock) come last, so that lock is
//! held only from the batch's last statement to its commit. If a batch fails (a broken
//! connection, a statement that fails) before its commit, nothing of it committed, and
//! each of its procedures runs again alone, so one bad request cannot fail the others.
//! If the commit itself fails, the batch may have committed (the answer was lost), so
//! nothing runs again: every caller gets `Unavailable` and must treat the outcome as
//! unknown (the write path leaves the new blob to the sweep unless it is unreferenced).
//!
//! Under light load a batch holds one procedure, and the cost is one channel hop.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::batch_tx::BatchTx;
use super::metadata::{MetadataStore, Procedure, ProcedureOutput, ReplayMark, StoreError, WriteTx};

/// Procedures in one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Procedures waiting for the writer at most (callers wait for room beyond that).
const QUEUE: usize = 4 * MAX_BATCH;

struct Job {
    procedure: Procedure,
    reply: oneshot::Sender<Result<ProcedureOutput, StoreError>>,
}

/// The queue of a store's rule-bearing writes, committed in groups by one writer task.
pub struct CommitQueue {
    queue: mpsc::Sender<Job>,
    writer: tokio::task::JoinHandle<()>,
}

/// What the writer needs of a store: transactions.
#[async_trait]
trait Transactions: Send + Sync {
    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError>;
}

struct StoreTransactions(Arc<dyn MetadataStore>);

#[async_trait]
impl Transactions for StoreTransactions {
    async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
        self.0.begin_write().await
    }
}

impl CommitQueue {
    /// Starts the writer task for `store` (on the current runtime). The store must be
    /// the one below the queue (its own `run_procedure` runs each alone).
    pub fn new(store: Arc<dyn MetadataStore>) -> Self {
        Self::with_transactions(Arc::new(StoreTransactions(store)))
    }

    fn with_transactions(store: Arc<dyn Transactions>) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let writer = tokio::spawn(write_batches(store, jobs));
        Self { queue, writer }
    }

    /// Runs `procedure` in the next batch and answers its outcome once that committed.
    pub async fn submit(&self, procedure: Procedure) -> Result<ProcedureOutput, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { procedure, reply })
            .await
            .map_err(|_| StoreError::Unavailable("the write queue is closed".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the write queue stopped".into()))?
    }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

/// The writer task: one batch at a time.
async fn write_batches(store: Arc<dyn Transactions>, mut jobs: mpsc::Receiver<Job>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while jobs.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Ordered by lock key; arrival order within a key (the sort is stable).
        batch.sort_by(|a: &Job, b: &Job| a.procedure.lock_key.cmp(&b.procedure.lock_key));
        if batch.len() == 1 {
            let job = batch.pop().expect("one job");
            let result = run_alone(store.as_ref(), &job.procedure).await;
            let _ = job.reply.send(result);
            continue;
        }
        match run_batch(store.as_ref(), &batch).await {
            Ok(outputs) => {
                for (job, output) in batch.drain(..).zip(outputs) {
                    let _ = job.reply.send(Ok(output));
                }
            }
            Err(BatchError::BeforeCommit(error)) => {
                tracing::debug!(%error, jobs = batch.len(), "a write batch failed; running its writes one by one");
                for job in batch.drain(..) {
                    let result = run_alone(store.as_ref(), &job.procedure).await;
                    let _ = job.reply.send(result);
                }
            }
            Err(BatchError::AtCommit(error)) => {
                // The commit may have happened (a connection lost after the database
                // committed, a deadline passed while it did): running the writes again
                // could apply them twice, or make a signed write look replayed. Each
                // caller hears that the outcome is unknown instead.
                tracing::warn!(%error, jobs = batch.len(), "a write batch's commit failed; its outcome is unknown");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Unavailable(format!(
                        "the write may or may not have been stored: {error}"
                    ))));
                }
            }
        }
    }
}

/// Why a batch failed: before its commit (nothing of it is stored) or at the commit
/// (it may be stored).
enum BatchError {
    BeforeCommit(StoreError),
    AtCommit(StoreError),
}

/// Runs `procedure` in a transaction of its own.
async fn run_alone(
    store: &dyn Transactions,
    procedure: &Procedure,
) -> Result<ProcedureOutput, StoreError> {
    let mut tx = store.begin_write().await?;
    let output = (procedure.run)(tx.as_mut()).await?;
    tx.commit().await?;
    Ok(output)
}

/// Runs every job's procedure in one transaction, through a [`BatchTx`]: what they
/// write alike (entries, usage, retired blobs, events) is sent at the end.
async fn run_batch(
    store: &dyn Transactions,
    batch: &[Job],
) -> Result<Vec<ProcedureOutput>, BatchError> {
    let steps = async {
        let mut tx = BatchTx::new(store.begin_write().await?);
        let marks: Vec<ReplayMark> = batch.iter().filter_map(|j| j.procedure.replay).collect();
        tx.spend_first(&marks).await?;
        let mut outputs = Vec::with_capacity(batch.len());
        for job in batch {
            outputs.push((job.procedure.run)(&mut tx).await?);
        }
        Ok::<_, StoreError>((tx.finish().await?, outputs))
    };
    let (tx, outputs) = steps.await.map_err(BatchError::BeforeCommit)?;
    tx.commit().await.map_err(BatchError::AtCommit)?;
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::persistence::BackendOptions;
    use crate::persistence::metadata::{
        EntryRecord, NewEvent, SessionRecord, TokenRedemption, UserRecord,
    };
    use crate::persistence::sql::SqlStore;

    /// A SQLite store in a folder of its own (kept while the store is used).
    async fn sqlite_store() -> (tempfile::TempDir, Arc<dyn MetadataStore>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/hs.db", dir.path().display());
        let url = crate::persistence::DatabaseUrl::parse(&url).unwrap();
        let store = SqlStore::open(&url, &BackendOptions::default())
            .await
            .unwrap();
        (dir, Arc::new(store))
    }

    /// Transactions whose commit happens, but whose answer is lost (as when a
    /// connection drops right after the database committed).
    struct LosesCommitAnswers(Arc<dyn MetadataStore>);

    struct AnswerLost(Box<dyn WriteTx>);

    #[async_trait]
    impl Transactions for LosesCommitAnswers {
        async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
            Ok(Box::new(AnswerLost(self.0.begin_write().await?)))
        }
    }

    #[async_trait]
    impl WriteTx for AnswerLost {
        async fn insert_replay_mark(&mut self, mark: ReplayMark) -> Result<bool, StoreError> {
            self.0.insert_replay_mark(mark).await
        }
        async fn insert_replay_marks(
            &mut self,
            marks: &[ReplayMark],
        ) -> Result<Vec<[u8; 32]>, StoreError> {
            self.0.insert_replay_marks(marks).await
        }
        async fn lock_user(&mut self, _: &str) -> Result<Option<UserRecord>, StoreError> {
            unreachable!()
        }
        async fn insert_user(
            &mut self,
            _: &str,
            _: i64,
            _: Option<&str>,
        ) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn delete_user(&mut self, _: &str) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn set_usage(&mut self, _: &str, _: u64, _: i64) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn redeem_signup_token(
            &mut self,
            _: &str,
            _: &str,
            _: i64,
        ) -> Result<TokenRedemption, StoreError> {
            unreachable!()
        }
        async fn entry(&mut self, _: &str, _: &str) -> Result<Option<EntryRecord>, StoreError> {
            unreachable!()
        }
        async fn put_entries(&mut self, _: &[(&str, &EntryRecord)]) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn remove_entry(
            &mut self,
            _: &str,
            _: &str,
        ) -> Result<Option<EntryRecord>, StoreError> {
            unreachable!()
        }
        async fn remove_all_entries(&mut self, _: &str) -> Result<Vec<EntryRecord>, StoreError> {
            unreachable!()
        }
        async fn insert_session(&mut self, _: &SessionRecord) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn sum_entry_sizes(&mut self, _: &str) -> Result<u64, StoreError> {
            unreachable!()
        }
        async fn retire_blobs(&mut self, _: &[&str], _: i64) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn append_events(&mut self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
            self.0.append_events(events).await
        }
        async fn commit(self: Box<Self>) -> Result<(), StoreError> {
            self.0.commit().await?;
            Err(StoreError::Unavailable(
                "connection lost after COMMIT".into(),
            ))
        }
    }

    #[tokio::test]
    async fn a_batch_whose_commit_answer_is_lost_is_not_run_again() {
        let (_dir, store) = sqlite_store().await;
        let queue = Arc::new(CommitQueue::with_transactions(Arc::new(
            LosesCommitAnswers(store.clone()),
        )));
        let runs = Arc::new(AtomicUsize::new(0));
        let submit = |n: u8| {
            let (queue, runs) = (queue.clone(), runs.clone());
            tokio::spawn(async move {
                let mark = ReplayMark {
                    signature_id: [n; 32],
                    expires_at: i64::MAX,
                };
                let procedure = Procedure::new(format!("user-{n}"), move |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Box::pin(async move { tx.insert_replay_mark(mark).await })
                });
                queue.submit(procedure).await.map(|_| ())
            })
        };
        // Spawned before the writer looks again: they form one batch.
        let callers: Vec<_> = (1..=4).map(submit).collect();
        for caller in callers {
            let answer = caller.await.unwrap();
            assert!(
                matches!(answer, Err(StoreError::Unavailable(_))),
                "the outcome is unknown, and the caller is told so: {answer:?}"
            );
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "each write ran exactly once"
        );
        // What the batch did is stored: each mark is there once.
        let mut tx = store.begin_write().await.unwrap();
        for n in 1..=4u8 {
            let fresh = tx
                .insert_replay_mark(ReplayMark {
                    signature_id: [n; 32],
                    expires_at: i64::MAX,
                })
                .await
                .unwrap();
            assert!(!fresh, "mark {n} was committed by the batch");
        }
    }

    /// Transactions counted as they begin.
    struct Counted(Arc<dyn MetadataStore>, Arc<AtomicUsize>);

    #[async_trait]
    impl Transactions for Counted {
        async fn begin_write(&self) -> Result<Box<dyn WriteTx>, StoreError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.begin_write().await
        }
    }

    /// Writes queued together run as one batch (one transaction: had the batch failed,
    /// each would have run again alone, in a transaction of its own): the same
    /// signature twice goes through once (whichever the batch runs first), every other
    /// write commits, and usage adds up.
    #[tokio::test]
    async fn a_batch_spends_each_signature_once() {
        use crate::persistence::metadata::{NewEntry, PutOutcome, Stored};
        use crate::persistence::rules;

        let (_dir, store) = sqlite_store().await;
        let mark = |n: u8| ReplayMark {
            signature_id: [n; 32],
            expires_at: i64::MAX,
        };
        let mut tx = store.begin_write().await.unwrap();
        rules::sign_up(tx.as_mut(), "alice", None, 1, mark(100))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let begun = Arc::new(AtomicUsize::new(0));
        let queue = Arc::new(CommitQueue::with_transactions(Arc::new(Counted(
            store.clone(),
            begun.clone(),
        ))));
        // (mark, path): marks 1 and 2 sent twice each, 3 and 4 once.
        let writes = [(1, "/pub/a"), (2, "/pub/b"), (1, "/pub/c"), (3, "/pub/d")];
        let writes = writes.into_iter().chain([(2, "/pub/e"), (4, "/pub/f")]);
        // Spawned before the writer looks again: they form one batch.
        let callers: Vec<_> = writes
            .map(|(n, path)| {
                let queue = queue.clone();
                let procedure = Procedure::new("alice", move |tx| {
                    Box::pin(async move {
                        let entry = NewEntry {
                            user: "alice",
                            path,
                            stored: Stored::Inline(vec![n; 10].into()),
                            size: 10,
                            content_hash: [n; 32],
                            now: 2,
                            default_quota: 0,
                        };
                        rules::put(tx, &entry, Some(mark(n))).await
                    })
                })
                .spending(Some(mark(n)));
                tokio::spawn(async move {
                    let output = queue.submit(procedure).await.unwrap();
                    (n, *output.downcast::<PutOutcome>().unwrap())
                })
            })
            .collect();
        let mut committed = Vec::new();
        for caller in callers {
            let (n, outcome) = caller.await.unwrap();
            match outcome {
                PutOutcome::Committed { .. } => committed.push(n),
                PutOutcome::Replayed => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(begun.load(Ordering::SeqCst), 1, "one batch, not run again");
        committed.sort_unstable();
        assert_eq!(committed, [1, 2, 3, 4], "each signature went through once");
        let user = store.user("alice").await.unwrap().unwrap();
        assert_eq!(user.used_bytes, 40);
    }
}
