//! Fair admission of requests across the connections of a shard.
//!
//! Owns the order in which a shard's connections hand whole frames to the
//! handler (deficit round-robin over the connections that have a frame
//! waiting) and how much work one pass of the executor takes in at most (an
//! admission **round**). It does not decode, read or answer anything: the
//! connection loop asks it before each frame it would hand over.
//!
//! Why: glommio runs every runnable task of the shard, first come first
//! served, before it looks at completed I/O again (a socket read, a log
//! write, a sync); a request needs several such trips (read, the commit's
//! write, its sync, the reply). Under load each trip waited behind every
//! frame the busy connections had handed over since the executor last polled
//! — 200 connections × a 32-frame turn is ≈ 6,400 requests, up to the
//! 100 ms preempt timer per trip. Admission here bounds both factors:
//!
//! - **Turns.** While any connection waits for admission, connections take
//!   turns in arrival order. A turn admits at most
//!   [`ADMISSION_QUANTUM_FRAMES`] frames and credits
//!   [`ADMISSION_QUANTUM_BYTES`] to the connection's deficit; a frame is
//!   admitted while the deficit is positive and its bytes are charged after
//!   (a large frame leaves a debt that skips the connection's next turns),
//!   so each waiting connection gets the same share in frames and in bytes,
//!   however many requests it pipelines. A connection that joins waits for
//!   at most one turn of each connection ahead of it. With nobody waiting, a
//!   connection is admitted at once (no turn-taking cost when idle).
//! - **Rounds.** At most [`ADMISSION_ROUND_FRAMES`] frames (or
//!   [`ADMISSION_ROUND_BYTES`]) are admitted per round. Once a round is
//!   spent, the connection whose turn it is waits on a timer of
//!   [`ADMISSION_ROUND_GAP`] (glommio fires timers only when it polls for
//!   I/O, which it does once the tasks that can run have run) before the
//!   next round starts. So a step of any request waits behind at most one
//!   round of newly admitted work, not behind everything every connection
//!   had buffered.
//!
//! One gate per executor thread (a shard is one thread), shared by every
//! connection made on it, like the connection ids.

use crate::limits::{
    ADMISSION_QUANTUM_BYTES, ADMISSION_QUANTUM_FRAMES, ADMISSION_ROUND_BYTES,
    ADMISSION_ROUND_FRAMES, ADMISSION_ROUND_GAP,
};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Whether a connection may hand over its next frame now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Hand it over (then [`Admission::charge`] its bytes).
    Go,
    /// Wait for [`Admission::turn`].
    Wait,
}

/// A connection waiting for, or holding, a turn.
#[derive(Debug, Default)]
struct Member {
    /// Bytes it may still hand over; negative after a frame larger than
    /// what its turns credited (paid back by later turns).
    deficit_bytes: i64,
    /// Frames left in its current turn (0 while it does not hold one).
    frames_left: usize,
    waker: Option<Waker>,
}

/// Counts of the gate's work, for tests and reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Frames admitted.
    pub admitted: u64,
    /// Turns given while connections waited.
    pub turns: u64,
    /// Rounds ended because the round's budget was spent.
    pub rounds_spent: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Connections with a frame waiting, in turn order; the front holds the
    /// turn.
    ring: VecDeque<u64>,
    members: HashMap<u64, Member>,
    round_frames: usize,
    round_bytes: usize,
    stats: AdmissionStats,
}

impl State {
    fn round_spent(&self) -> bool {
        self.round_frames >= ADMISSION_ROUND_FRAMES || self.round_bytes >= ADMISSION_ROUND_BYTES
    }

    /// Gives the front of the ring a new turn and wakes it.
    fn start_turn(&mut self) {
        let Some(&head) = self.ring.front() else {
            return;
        };
        let member = self.members.entry(head).or_default();
        member.deficit_bytes = member.deficit_bytes.saturating_add(ADMISSION_QUANTUM_BYTES);
        member.frames_left = ADMISSION_QUANTUM_FRAMES;
        self.stats.turns += 1;
        if let Some(waker) = member.waker.take() {
            waker.wake();
        }
    }

    /// Takes `id` out of the ring; the next one gets the turn if `id` held
    /// it. Returns whether it held the turn.
    fn remove(&mut self, id: u64) -> bool {
        let Some(at) = self.ring.iter().position(|&member| member == id) else {
            return false;
        };
        self.ring.remove(at);
        if at == 0 {
            self.start_turn();
        }
        at == 0
    }
}

/// The admission gate of one shard. See the module docs.
#[derive(Debug, Default)]
pub struct Admission {
    state: RefCell<State>,
}

thread_local! {
    static SHARD_ADMISSION: Rc<Admission> = Rc::default();
}

impl Admission {
    /// The gate of this executor thread (one per shard).
    pub fn of_this_shard() -> Rc<Admission> {
        SHARD_ADMISSION.with(Rc::clone)
    }

    /// Whether connection `id` may hand over a frame now. On `Wait` it has
    /// a place in the turn order (kept until [`Admission::pass`] or
    /// [`Admission::leave`]) and should await [`Admission::turn`].
    pub fn ready(&self, id: u64) -> Admit {
        let mut state = self.state.borrow_mut();
        if state.ring.is_empty() {
            if !state.round_spent() {
                return Admit::Go;
            }
            // First to find the round spent: it takes the turn and waits
            // for the next round.
            state.ring.push_back(id);
            state.start_turn();
            return Admit::Wait;
        }
        if state.ring.front() != Some(&id) {
            if !state.ring.contains(&id) {
                state.ring.push_back(id);
                state.members.entry(id).or_default();
            }
            return Admit::Wait;
        }
        if state.round_spent() {
            return Admit::Wait;
        }
        let member = state.members.entry(id).or_default();
        if member.frames_left > 0 && member.deficit_bytes > 0 {
            return Admit::Go;
        }
        // Its turn is over: to the back of the line, the next one's turn.
        state.ring.pop_front();
        state.ring.push_back(id);
        state.start_turn();
        if state.ring.len() == 1 {
            // Alone: its new turn starts at once (paying back a debt takes
            // as many turns as it needs, with nobody else to wait).
            let member = state.members.entry(id).or_default();
            if member.deficit_bytes <= 0 {
                member.deficit_bytes = ADMISSION_QUANTUM_BYTES;
            }
            return Admit::Go;
        }
        Admit::Wait
    }

    /// Counts a frame of `len_bytes` that connection `id` handed over after
    /// [`Admission::ready`] said `Go`.
    pub fn charge(&self, id: u64, len_bytes: usize) {
        let mut state = self.state.borrow_mut();
        state.round_frames += 1;
        state.round_bytes = state.round_bytes.saturating_add(len_bytes);
        state.stats.admitted += 1;
        if state.ring.front() == Some(&id) {
            if let Some(member) = state.members.get_mut(&id) {
                member.frames_left = member.frames_left.saturating_sub(1);
                let charged = i64::try_from(len_bytes).unwrap_or(i64::MAX);
                member.deficit_bytes = member.deficit_bytes.saturating_sub(charged);
            }
        }
    }

    /// Connection `id` has nothing it can hand over for now (no whole frame,
    /// no free in-flight permit, its answers unread): it gives up its place
    /// (and its turn, if it held it). A debt it ran up is kept.
    pub fn pass(&self, id: u64) {
        let mut state = self.state.borrow_mut();
        state.remove(id);
        if let Some(member) = state.members.get_mut(&id) {
            member.deficit_bytes = member.deficit_bytes.min(0);
            member.frames_left = 0;
            member.waker = None;
            if member.deficit_bytes == 0 {
                state.members.remove(&id);
            }
        }
    }

    /// Connection `id` is gone: forgets it, passing its turn on.
    pub fn leave(&self, id: u64) {
        let mut state = self.state.borrow_mut();
        state.remove(id);
        state.members.remove(&id);
    }

    /// Resolves when connection `id` (which got `Wait`) holds the turn and
    /// the round has room; the holder of the turn of a spent round waits
    /// here for the next round.
    pub async fn turn(&self, id: u64) {
        loop {
            let round_over = std::future::poll_fn(|cx| {
                let mut state = self.state.borrow_mut();
                if state.ring.front() == Some(&id) {
                    return Poll::Ready(state.round_spent());
                }
                if !state.ring.contains(&id) {
                    // Not waiting (it passed or left): nothing to wait for.
                    return Poll::Ready(false);
                }
                state.members.entry(id).or_default().waker = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
            if !round_over {
                return;
            }
            glommio::timer::Timer::new(ADMISSION_ROUND_GAP).await;
            self.next_round();
        }
    }

    /// Starts a new round (called by the holder of the turn once the round
    /// gap has passed).
    pub fn next_round(&self) {
        let mut state = self.state.borrow_mut();
        if state.round_spent() {
            state.stats.rounds_spent += 1;
        }
        state.round_frames = 0;
        state.round_bytes = 0;
    }

    /// Connections waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.state.borrow().ring.len()
    }

    pub fn stats(&self) -> AdmissionStats {
        self.state.borrow().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admits frames of `len` for `id` while the gate says `Go`, at most
    /// `max`; returns how many.
    fn take(gate: &Admission, id: u64, len: usize, max: usize) -> usize {
        let mut taken = 0;
        while taken < max && gate.ready(id) == Admit::Go {
            gate.charge(id, len);
            taken += 1;
        }
        taken
    }

    /// Plays the part of the executor: whoever holds the turn takes what it
    /// wants; a spent round starts the next one. Returns the connection
    /// that was served and how many frames it handed over.
    fn serve_turn(gate: &Admission, wants: &mut HashMap<u64, usize>, len: usize) -> (u64, usize) {
        let head = *gate.state.borrow().ring.front().expect("someone waits");
        if gate.state.borrow().round_spent() {
            gate.next_round();
        }
        let left = wants[&head];
        let taken = take(gate, head, len, left);
        *wants.get_mut(&head).expect("known") -= taken;
        if wants[&head] == 0 {
            gate.pass(head);
        }
        (head, taken)
    }

    // Goal: a light connection that joins while heavy ones keep frames
    // waiting is admitted after at most one turn of each heavy connection,
    // and every turn hands over at most the quantum. Method: 8 heavy
    // connections with endless frames fill the round and queue; a light one
    // arrives; drive turns as the executor would and count the heavy frames
    // admitted before the light one.
    #[test]
    fn a_light_connection_waits_at_most_one_turn_of_each_heavy_one() {
        const HEAVY: u64 = 8;
        let gate = Admission::default();
        let mut wants: HashMap<u64, usize> = (0..HEAVY).map(|id| (id, usize::MAX)).collect();
        // Heavy connections spend the round on the fast path, then queue.
        for id in 0..HEAVY {
            take(&gate, id, 100, ADMISSION_ROUND_FRAMES);
        }
        for id in 0..HEAVY {
            assert_eq!(gate.ready(id), Admit::Wait);
        }
        let light = 99;
        wants.insert(light, 1);
        assert_eq!(gate.ready(light), Admit::Wait, "others wait: it takes its place in line");
        let mut heavy_before = 0;
        loop {
            let (served, taken) = serve_turn(&gate, &mut wants, 100);
            assert!(taken <= ADMISSION_QUANTUM_FRAMES, "a turn is at most the quantum");
            if served == light {
                assert_eq!(taken, 1);
                break;
            }
            heavy_before += taken;
        }
        assert!(
            heavy_before <= HEAVY as usize * ADMISSION_QUANTUM_FRAMES,
            "{heavy_before} heavy frames before the light one"
        );
        assert!(gate.stats().turns >= HEAVY);
    }

    // Goal: shares are fair in bytes too: a connection sending frames far
    // larger than the quantum gets its bytes' worth of turns, not one frame
    // per turn like a connection of small frames. Method: two always-busy
    // connections, one of 256 KiB frames and one of 1 KiB frames; serve
    // many turns and compare the bytes each handed over.
    #[test]
    fn large_frames_pay_for_their_bytes_in_turns() {
        let gate = Admission::default();
        let (big, small) = (1u64, 2u64);
        let mut bytes: HashMap<u64, usize> = HashMap::new();
        take(&gate, big, 256 * 1024, ADMISSION_ROUND_FRAMES);
        assert_eq!(gate.ready(big), Admit::Wait);
        assert_eq!(gate.ready(small), Admit::Wait);
        for _ in 0..400 {
            let head = *gate.state.borrow().ring.front().expect("both wait");
            if gate.state.borrow().round_spent() {
                gate.next_round();
            }
            let len = if head == big { 256 * 1024 } else { 1024 };
            let taken = take(&gate, head, len, usize::MAX);
            *bytes.entry(head).or_default() += taken * len;
            // It still has frames: its place is back in line, not passed.
            assert!(gate.state.borrow().ring.contains(&head));
        }
        let (big_bytes, small_bytes) = (bytes[&big], bytes[&small]);
        // The small-frame connection is capped by the frame quantum
        // (4 KiB a turn), the large one by the byte quantum: it gets no
        // more than its 64 KiB a turn on average, plus one frame.
        let turns = gate.stats().turns as usize;
        assert!(
            big_bytes <= turns / 2 * ADMISSION_QUANTUM_BYTES as usize + 256 * 1024,
            "big {big_bytes} B over {turns} turns"
        );
        assert!(small_bytes > 0);
    }

    // Goal: with nobody waiting a connection is never held up: admission
    // is immediate until the round's budget is spent, and whoever finds
    // it spent waits for the next round and then goes first.
    #[test]
    fn an_idle_gate_admits_at_once_and_a_spent_round_waits_for_the_next() {
        let gate = Admission::default();
        assert_eq!(take(&gate, 1, 10, usize::MAX), ADMISSION_ROUND_FRAMES);
        // 1 found the round spent: it holds the turn of the next round.
        assert_eq!(gate.ready(2), Admit::Wait, "behind 1");
        assert_eq!(gate.ready(1), Admit::Wait, "the round is spent");
        gate.next_round();
        assert_eq!(take(&gate, 1, 10, usize::MAX), ADMISSION_QUANTUM_FRAMES, "one turn, then 2's");
        assert_eq!(gate.ready(2), Admit::Go);
        gate.pass(2);
        assert_eq!(gate.ready(1), Admit::Go, "then 1 again");
        gate.leave(1);
        assert_eq!(gate.waiting(), 0);
        assert!(gate.state.borrow().members.is_empty(), "nothing kept for gone connections");
    }
}
