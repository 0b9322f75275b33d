//! The default safety-filter guest: the WIT glue around [`filter`]. The wordlists and
//! switches come from the slot's `config` (policies/wordlists/*.txt by default).

mod filter;

use std::sync::OnceLock;

use exports::homeserver::guest::safety::{Guest, TermMatch, Verdict};
use homeserver::guest::config;

wit_bindgen::generate!({
    path: "../../wit",
    world: "safety-filter",
});

/// Config never changes during an instance's life (see the WIT), so parse it once.
static FILTER: OnceLock<filter::Filter> = OnceLock::new();

struct SafetyFilter;

impl Guest for SafetyFilter {
    fn check(text: String) -> Verdict {
        let filter = FILTER.get_or_init(|| filter::Filter::from_config(config::get, config::keys));
        let verdict = filter.check(&text);
        Verdict {
            matches: verdict
                .matches
                .into_iter()
                .map(|m| TermMatch {
                    term: m.term,
                    list_name: m.list,
                })
                .collect(),
            blocked: verdict.blocked,
        }
    }
}

export!(SafetyFilter);
