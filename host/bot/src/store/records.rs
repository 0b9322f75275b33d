//! What the bot records, as its stages see it: mentions and their states, routing
//! decisions, executions and their outcomes, replies, and the embedded index's posts.
//! How each is stored is the store's business (`store::*`).

/// One change of the embedded index.
#[derive(Debug, Clone)]
pub enum IndexChange {
    Put(IndexedPost),
    /// A post deleted (by URI).
    Delete(String),
}

/// A mention's state (the spec's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MentionStatus {
    Pending,
    Processing,
    Completed,
    Failed,
    SkippedOld,
}

impl MentionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::SkippedOld => "skipped_old",
        }
    }

    pub(super) fn parse(text: &str) -> Self {
        match text {
            "processing" => Self::Processing,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "skipped_old" => Self::SkippedOld,
            _ => Self::Pending,
        }
    }
}

/// The two actions, and `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionType {
    Summary,
    Factcheck,
    None,
}

impl ActionType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summary => "summary",
            Self::Factcheck => "factcheck",
            Self::None => "none",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "summary" => Some(Self::Summary),
            "factcheck" => Some(Self::Factcheck),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// How a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Heuristic,
    Llm,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Heuristic => "heuristic",
            Self::Llm => "llm",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mention {
    pub id: String,
    pub author: String,
    pub post_id: String,
    pub post_uri: String,
    pub content: String,
    pub parent_uri: Option<String>,
    /// Unix seconds of the post.
    pub posted_at: i64,
    pub status: MentionStatus,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingDecision {
    pub mention_id: String,
    pub method: Method,
    pub action: ActionType,
    pub confidence: Option<f32>,
    pub reasoning: String,
    /// What to answer instead of running an action (opt-out confirmed, slow down).
    pub notice: Option<String>,
    /// What the decision changes besides the mention.
    pub effect: Option<Effect>,
    /// The root of the mention's thread.
    pub thread_root: Option<String>,
}

/// A change a routing decision makes besides the mention's own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    OptOut,
    OptIn,
    RateNotice,
}

impl Effect {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::OptOut => "opt_out",
            Self::OptIn => "opt_in",
            Self::RateNotice => "rate_notice",
        }
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        match text {
            "opt_out" => Some(Self::OptOut),
            "opt_in" => Some(Self::OptIn),
            "rate_notice" => Some(Self::RateNotice),
            _ => None,
        }
    }
}

/// A finished, successful execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub id: i64,
    pub reply: String,
}

/// What an execution produced, to store with it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub reply: String,
    pub tokens_used: u64,
    /// (artifact_type, JSON document)
    pub artifacts: Vec<(&'static str, serde_json::Value)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub mention_id: String,
    pub post_id: String,
    pub content: String,
    pub thread_root: String,
    pub published_at: Option<i64>,
}

/// A post of the embedded index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedPost {
    pub seq: i64,
    pub uri: String,
    pub author: String,
    pub post_id: String,
    pub content: String,
    pub kind: String,
    pub parent_uri: Option<String>,
    pub mentions_bot: bool,
}
