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
//!   spent, the connection whose turn it is waits for the executor's next
//!   poll for I/O and the tasks it woke
//!   ([`crate::net::poll_gate::after_next_poll`]) before the next round
//!   starts. So a step of any request waits behind at most one
//!   round of newly admitted work, not behind everything every connection
//!   had buffered.
//!
//! One gate per executor thread (a shard is one thread), shared by every
//! connection made on it, like the connection ids.

use crate::limits::{
    ADMISSION_QUANTUM_BYTES, ADMISSION_QUANTUM_FRAMES, ADMISSION_ROUND_BYTES,
    ADMISSION_ROUND_FRAMES,
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

/// Which line a connection's place is (or its turn came from).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Joined after having nothing waiting for a whole cycle: served first.
    #[default]
    New,
    /// Used a whole turn, or came back within a cycle.
    Old,
}

/// A connection with a place in line, holding the turn, or paying back a
/// debt.
#[derive(Debug, Default)]
struct Member {
    /// Bytes it may still hand over; negative after a frame larger than
    /// what its turns credited (paid back by later turns).
    deficit_bytes: i64,
    /// Frames left in its current turn (0 while it does not hold one).
    frames_left: usize,
    waker: Option<Waker>,
    /// It has frames it wants to hand over (it asked and got `Wait`, or
    /// holds the turn).
    wants: bool,
    /// It has a place in `new` or `old` (a place may be kept while it has
    /// nothing waiting: see the module docs).
    placed: bool,
    /// The line of its place, or of the turn it holds.
    line: Line,
}

/// Counts of the gate's work, for tests and reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Frames admitted.
    pub admitted: u64,
    /// Turns given while connections waited.
    pub turns: u64,
    /// Turns given from the new line (connections that had been idle).
    pub new_turns: u64,
    /// Rounds ended because the round's budget was spent.
    pub rounds_spent: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Places of connections that had nothing waiting for a whole cycle, in
    /// arrival order; served before `old`. May hold ids of connections that
    /// left since (skipped).
    new: VecDeque<u64>,
    /// Places of the others, in turn order.
    old: VecDeque<u64>,
    /// The connection holding the turn (it has no place while it does).
    holder: Option<u64>,
    /// Members that want to hand over frames (placed or holding the turn).
    wanting: usize,
    members: HashMap<u64, Member>,
    round_frames: usize,
    round_bytes: usize,
    stats: AdmissionStats,
}

impl State {
    fn round_spent(&self) -> bool {
        self.round_frames >= ADMISSION_ROUND_FRAMES || self.round_bytes >= ADMISSION_ROUND_BYTES
    }

    /// Gives the turn to the first place, new line first, that wants it,
    /// and wakes it. Places of connections that have nothing waiting are
    /// settled on the way: a new one moves to the back of the old line (so
    /// a connection cannot regain priority by emptying its buffer once per
    /// turn), an old one is dropped. No holder when nobody wants a turn.
    fn start_turn(&mut self) {
        self.holder = None;
        loop {
            let (id, line) = if let Some(id) = self.new.pop_front() {
                (id, Line::New)
            } else if let Some(id) = self.old.pop_front() {
                (id, Line::Old)
            } else {
                return;
            };
            let Some(member) = self.members.get_mut(&id) else {
                continue; // it left
            };
            if !member.wants {
                if line == Line::New {
                    member.line = Line::Old;
                    self.old.push_back(id);
                } else {
                    member.placed = false;
                    if member.deficit_bytes >= 0 {
                        self.members.remove(&id);
                    }
                }
                continue;
            }
            member.placed = false;
            member.line = line;
            member.deficit_bytes = member.deficit_bytes.saturating_add(ADMISSION_QUANTUM_BYTES);
            member.frames_left = ADMISSION_QUANTUM_FRAMES;
            self.holder = Some(id);
            self.stats.turns += 1;
            if line == Line::New {
                self.stats.new_turns += 1;
            }
            if let Some(waker) = member.waker.take() {
                waker.wake();
            }
            return;
        }
    }

    /// `id` (a member) wants a turn: gives it a place at the back of the
    /// new line unless it has one.
    fn want(&mut self, id: u64) {
        let member = self.members.entry(id).or_default();
        if !member.wants {
            member.wants = true;
            self.wanting += 1;
        }
        if !member.placed && self.holder != Some(id) {
            member.placed = true;
            member.line = Line::New;
            self.new.push_back(id);
        }
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
    /// a place in line (kept until [`Admission::pass`] or
    /// [`Admission::leave`]) and should await [`Admission::turn`].
    pub fn ready(&self, id: u64) -> Admit {
        let mut state = self.state.borrow_mut();
        if state.holder == Some(id) {
            if state.round_spent() {
                return Admit::Wait;
            }
            let member = state.members.entry(id).or_default();
            if member.frames_left > 0 && member.deficit_bytes > 0 {
                return Admit::Go;
            }
            // Its turn is over: to the back of the old line, the next
            // one's turn.
            member.placed = true;
            member.line = Line::Old;
            state.old.push_back(id);
            state.start_turn();
            if state.holder == Some(id) && state.wanting == 1 {
                // Alone: its new turn starts at once (paying back a debt
                // takes as many turns as it needs, with nobody else to wait).
                let member = state.members.entry(id).or_default();
                if member.deficit_bytes <= 0 {
                    member.deficit_bytes = ADMISSION_QUANTUM_BYTES;
                }
                return Admit::Go;
            }
            return Admit::Wait;
        }
        if state.holder.is_none() && state.wanting == 0 {
            if !state.round_spent() {
                return Admit::Go;
            }
            // First to find the round spent: it takes the turn and waits
            // for the next round.
            state.want(id);
            state.start_turn();
            return Admit::Wait;
        }
        state.want(id);
        if state.holder.is_none() {
            // Nobody holds the turn although someone wanted it (cannot
            // happen: a turn is handed on whenever it ends): hand it on now
            // rather than leave everyone waiting.
            state.start_turn();
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
        if state.holder == Some(id) {
            if let Some(member) = state.members.get_mut(&id) {
                member.frames_left = member.frames_left.saturating_sub(1);
                let charged = i64::try_from(len_bytes).unwrap_or(i64::MAX);
                member.deficit_bytes = member.deficit_bytes.saturating_sub(charged);
            }
        }
    }

    /// Connection `id` has nothing it can hand over for now (no whole frame,
    /// no free in-flight permit, its answers unread): it gives up its turn
    /// if it held it. A debt it ran up is kept; so is its place for one more
    /// cycle if it came from the new line (module docs).
    pub fn pass(&self, id: u64) {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        let Some(member) = state.members.get_mut(&id) else {
            return;
        };
        if member.wants {
            member.wants = false;
            state.wanting -= 1;
        }
        member.deficit_bytes = member.deficit_bytes.min(0);
        member.frames_left = 0;
        member.waker = None;
        if state.holder == Some(id) {
            if member.line == Line::New {
                member.placed = true;
                member.line = Line::Old;
                state.old.push_back(id);
            } else if member.deficit_bytes == 0 {
                state.members.remove(&id);
            }
            state.start_turn();
        } else if !member.placed && member.deficit_bytes == 0 {
            state.members.remove(&id);
        }
    }

    /// Connection `id` is gone: forgets it, passing its turn on. Its place,
    /// if any, is skipped when reached.
    pub fn leave(&self, id: u64) {
        let mut state = self.state.borrow_mut();
        if let Some(member) = state.members.remove(&id) {
            if member.wants {
                state.wanting -= 1;
            }
        }
        if state.holder == Some(id) {
            state.start_turn();
        }
    }

    /// Resolves when connection `id` (which got `Wait`) holds the turn and
    /// the round has room; the holder of the turn of a spent round waits
    /// here for the next round.
    pub async fn turn(&self, id: u64) {
        loop {
            let round_over = std::future::poll_fn(|cx| {
                let mut state = self.state.borrow_mut();
                if state.holder == Some(id) {
                    return Poll::Ready(state.round_spent());
                }
                match state.members.get_mut(&id) {
                    Some(member) if member.wants => {
                        member.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                    // Not waiting (it passed or left): nothing to wait for.
                    _ => Poll::Ready(false),
                }
            })
            .await;
            if !round_over {
                return;
            }
            crate::net::poll_gate::after_next_poll().await;
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

    /// Connections waiting for a turn or holding it now.
    pub fn waiting(&self) -> usize {
        self.state.borrow().wanting
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

    fn holder(gate: &Admission) -> u64 {
        gate.state.borrow().holder.expect("someone holds the turn")
    }

    /// Plays the part of the executor: whoever holds the turn takes what it
    /// wants; a spent round starts the next one. Returns the connection
    /// that was served and how many frames it handed over.
    fn serve_turn(gate: &Admission, wants: &mut HashMap<u64, usize>, len: usize) -> (u64, usize) {
        let head = holder(gate);
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

    /// 8 heavy connections with endless frames that spent the round and
    /// now queue for turns, each served once so that all are in the old
    /// line.
    fn saturated_gate(heavy: u64, wants: &mut HashMap<u64, usize>) -> Admission {
        let gate = Admission::default();
        for id in 0..heavy {
            wants.insert(id, usize::MAX);
            take(&gate, id, 100, ADMISSION_ROUND_FRAMES);
        }
        for id in 0..heavy {
            assert_eq!(gate.ready(id), Admit::Wait);
        }
        for _ in 0..heavy {
            serve_turn(&gate, wants, 100);
        }
        assert_eq!(gate.state.borrow().new.len(), 0, "every heavy one used a whole turn");
        gate
    }

    // Goal: a light connection (nothing waiting for a while) that joins
    // while heavy ones keep frames waiting is served next, after at most
    // the turn in progress, and every turn hands over at most the quantum.
    // Method: heavy connections with endless frames fill the round and
    // queue; a light one arrives; drive turns as the executor would and
    // count the heavy frames admitted before the light one. Without the
    // new line it waits behind one turn of every heavy connection.
    #[test]
    fn a_light_connection_is_served_after_at_most_the_turn_in_progress() {
        const HEAVY: u64 = 8;
        let mut wants = HashMap::new();
        let gate = saturated_gate(HEAVY, &mut wants);
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
            heavy_before <= ADMISSION_QUANTUM_FRAMES,
            "{heavy_before} heavy frames before the light one"
        );
        assert!(gate.stats().new_turns >= 1);
    }

    // Goal: a connection cannot keep the new line's priority by emptying
    // its buffer at every turn and refilling it at once: it gets at most
    // about twice the turns of an always-busy connection, never a turn
    // ahead of every other one each time. Method: heavy connections plus
    // one that hands over one frame per turn, passes, and at once wants
    // again; count its turns against a heavy one's.
    #[test]
    fn a_connection_that_empties_every_turn_gets_no_more_than_twice_a_share() {
        const HEAVY: u64 = 8;
        let mut wants = HashMap::new();
        let gate = saturated_gate(HEAVY, &mut wants);
        let pulsing = 50;
        let mut turns: HashMap<u64, usize> = HashMap::new();
        assert_eq!(gate.ready(pulsing), Admit::Wait);
        wants.insert(pulsing, 1);
        for _ in 0..(HEAVY as usize * 50) {
            let (served, _) = serve_turn(&gate, &mut wants, 100);
            *turns.entry(served).or_default() += 1;
            if served == pulsing {
                // It emptied (passed); its next frame arrives at once.
                wants.insert(pulsing, 1);
                assert_eq!(gate.ready(pulsing), Admit::Wait);
            }
        }
        let heavy_turns = turns[&0];
        assert!(heavy_turns >= 40, "heavy 0 got {heavy_turns} turns");
        assert!(
            turns[&pulsing] <= 2 * heavy_turns + 1,
            "pulsing {} turns against heavy {heavy_turns}",
            turns[&pulsing]
        );
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
            let head = holder(&gate);
            if gate.state.borrow().round_spent() {
                gate.next_round();
            }
            let len = if head == big { 256 * 1024 } else { 1024 };
            let taken = take(&gate, head, len, usize::MAX);
            *bytes.entry(head).or_default() += taken * len;
            // It still has frames: its place is back in line, not passed.
            assert!(gate.state.borrow().old.contains(&head) || holder(&gate) == head);
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
        // 2 keeps a place for one more cycle (it came from the new line);
        // the next turn settles it and nothing is left.
        assert_eq!(gate.ready(3), Admit::Go, "nobody waits: at once");
        gate.pass(3);
        gate.state.borrow_mut().start_turn();
        assert!(gate.state.borrow().members.is_empty(), "nothing kept for gone connections");
    }

    // Goal: a connection that leaves while it holds the turn or has a
    // place never blocks the others. Method: three wait; the holder and a
    // placed one leave; the third gets the turn.
    #[test]
    fn leaving_hands_the_turn_on_and_places_of_gone_connections_are_skipped() {
        let gate = Admission::default();
        take(&gate, 1, 10, usize::MAX);
        assert_eq!(gate.ready(1), Admit::Wait);
        assert_eq!(gate.ready(2), Admit::Wait);
        assert_eq!(gate.ready(3), Admit::Wait);
        assert_eq!(holder(&gate), 1);
        gate.leave(2);
        gate.leave(1);
        assert_eq!(holder(&gate), 3);
        assert_eq!(gate.waiting(), 1);
    }
}
