//! What the peer transport tests share: one glommio executor per test
//! with a deadline, and bounded waits for a counter.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use futures_lite::future::or;
use glommio::{LocalExecutorBuilder, Placement};
use spool_broker::clock::instant_now;

/// The whole test, executor included, must end within this.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a test waits for one event (a counter reaching a value).
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

pub fn run(test: impl Future<Output = ()> + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(0)
        .make()
        .expect("glommio executor")
        .run(async move {
            let finished = or(
                async {
                    test.await;
                    true
                },
                async {
                    glommio::timer::sleep(TEST_TIMEOUT).await;
                    false
                },
            )
            .await;
            assert!(finished, "test did not finish within {TEST_TIMEOUT:?}");
        });
}

/// Waits, bounded, until `ready` holds (polling a counter every 2 ms).
pub async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = instant_now();
    while !ready() {
        assert!(started.elapsed() < EVENT_TIMEOUT, "timed out waiting for {what}");
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}
