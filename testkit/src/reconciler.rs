//! The reconciler's options as tests start it in-process: two workers, a 5 ms debounce, the
//! product's timeouts, every namespace, no leader election, no CRD check. A test changes the
//! fields its scenario is about.

use std::time::Duration;

use jobset_inplace::protocol::Dialect;
use jobset_inplace::reconciler::{self, Options, Settings};

/// The settings a test's reconciler starts from.
pub fn settings(dialect: Dialect, identity: &str) -> Settings {
    Settings {
        dialect,
        namespace: None,
        workers: 2,
        debounce: Duration::from_millis(5),
        identity: identity.to_owned(),
        provision: None,
        request_timeout: reconciler::DEFAULT_REQUEST_TIMEOUT,
        watch_timeout: reconciler::DEFAULT_WATCH_TIMEOUT,
        write_epoch_status: true,
        publish_epochs: true,
        group_restart_timeout: Some(reconciler::DEFAULT_GROUP_RESTART_TIMEOUT),
        // The test kit's nodes send no heartbeat (tests/it/system/ watch no Nodes).
        node_lost_grace: None,
    }
}

/// [`settings`], without leader election or the start-up CRD check.
pub fn options(dialect: Dialect, identity: &str) -> Options {
    Options {
        settings: settings(dialect, identity),
        leader_election: None,
        check_crd: false,
    }
}
