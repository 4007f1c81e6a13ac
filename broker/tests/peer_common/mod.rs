//! What the peer transport tests share: one glommio executor per test
//! with a deadline, and bounded waits for a counter.
#![allow(dead_code)]

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future::or;
use glommio::{LocalExecutorBuilder, Placement};
use raft::eraftpb::{Entry, Message, MessageType};
use spool_broker::clock::instant_now;
use spool_broker::replica::wire::GroupId;

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

/// Frames' messages as a receiver's sink kept them: (sending node, group, message).
pub type Received = Rc<RefCell<Vec<(u64, GroupId, Message)>>>;

/// An append from `from` to `to` whose `index` numbers it in its group,
/// with one entry of `data_len` bytes.
pub fn message(from: u64, to: u64, index: u64, data_len: usize) -> Message {
    let mut message = Message {
        msg_type: MessageType::MsgAppend,
        from,
        to,
        term: 3,
        log_term: 2,
        index,
        commit: 5,
        ..Message::default()
    };
    message.entries = vec![Entry {
        index: index + 1,
        term: 3,
        data: vec![(index % 251) as u8; data_len].into(),
        ..Entry::default()
    }]
    .into();
    message
}
