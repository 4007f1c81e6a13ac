//! A witness (or commit) delay the test ends by hand, for the shard
//! journal's witness entries and held cycles.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};

use spool_broker::log::WitnessDelay;

/// Every delay made waits until [`Gate::open`]; counts the delays made.
#[derive(Default)]
pub struct Gate {
    opened: Cell<bool>,
    pub made: Cell<u32>,
    wakers: RefCell<Vec<Waker>>,
}

impl Gate {
    pub fn delay(self: &Rc<Self>) -> WitnessDelay {
        let gate = self.clone();
        Rc::new(move || {
            gate.made.set(gate.made.get() + 1);
            let gate = gate.clone();
            Box::pin(std::future::poll_fn(move |cx| {
                if gate.opened.get() {
                    Poll::Ready(())
                } else {
                    gate.wakers.borrow_mut().push(cx.waker().clone());
                    Poll::Pending
                }
            }))
        })
    }

    #[allow(dead_code)] // not every test binary ends its delays by hand
    pub fn open(&self) {
        self.opened.set(true);
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }
}
