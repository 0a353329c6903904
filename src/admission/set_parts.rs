//! A large set received in parts, joined part by part ([`RangeJoin::join_set_part`],
//! [`RangeJoin::close_set`]) instead of put back together: exactly the whole set's join, with
//! about one part's elements in memory.
//!
//! Why it is exact: a set's join is element by element, `new(e) = (s∩s') ∪ (s∖c') ∪ (s'∖c)`
//! for the element's local dots `s`, carried dots `s'`, and the contexts `c` (local) and `c'`
//! (the transfer's). The parts' dot slices cover dot space once, so joining each part under
//! `c'` inside its slice gives that rule for every dot the parts carry and every local dot of an
//! element some part names, inside that part's slice. What is left are the local dots inside
//! `c'` that no part carries under their element: the dots of elements no part names (or names
//! in another slice), removed at the end ([`RangeJoin::close_set`], a window of elements at a
//! time, only when the receiver held the set before), and a dot a part carries under another
//! element than the local one (input no correct replica builds), whose local element is joined
//! with that part (found through the dot index).

use super::{KeyRange, RangeJoin};
use tidemark_crdts::{CausalContext, Dot, DotMap, DotSet, DotStore, Entry, Key, KeyKind};

/// Local elements [`RangeJoin::close_set`] reads at once.
pub const SET_PART_WINDOW: usize = 1024;

/// Row backends that read a set's elements one by one (the rows of a set stored per element).
pub trait SetRows: KeyRange {
    /// Whether the set `key` has an element.
    ///
    /// # Errors
    /// Backend failures.
    fn set_held(&mut self, key: &Key) -> Result<bool, Self::Error>;

    /// The elements named in `names` (ascending) of the set `key`, one row each; absent ones
    /// are left out.
    ///
    /// # Errors
    /// Backend failures.
    fn set_elems(
        &mut self,
        key: &Key,
        names: &[String],
    ) -> Result<DotMap<String, DotSet>, Self::Error>;

    /// Up to `max` elements of the set `key` after the element `after` (from the first when
    /// `None`), ascending.
    ///
    /// # Errors
    /// Backend failures.
    fn set_elems_after(
        &mut self,
        key: &Key,
        after: Option<&str>,
        max: usize,
    ) -> Result<DotMap<String, DotSet>, Self::Error>;

    /// The elements of the set `key` holding one of `dots` (through the dot index).
    ///
    /// # Errors
    /// Backend failures.
    fn dot_elems(&mut self, key: &Key, dots: &[Dot]) -> Result<Vec<String>, Self::Error>;
}

/// A large set being joined part by part.
#[derive(Debug)]
pub(super) struct OpenSet {
    key: Key,
    /// The local dots the parts removed so far, held back from the inflation until the set
    /// closes: logged before the set's later parts, they would let a peer that applied a prefix
    /// of the run lose an element's old dot before its new one arrives.
    removed: CausalContext,
    /// Some part changed the set's rows (a change is never undone by a later part: it removed
    /// a dot no later part carries, or added one).
    changed: bool,
    /// The receiver held an element of the set before its first part.
    held_before: bool,
    /// The dots the parts carried (interval-compressed).
    carried: CausalContext,
}

impl RangeJoin {
    /// The key of the large set whose parts are being joined, if any.
    pub fn open_set_key(&self) -> Option<&Key> {
        self.open_set.as_ref().map(|o| &o.key)
    }

    /// Joins one part of the large set `key` (`theirs`: its elements' dots inside the part's
    /// dot slice; `slice_ctx`: the transfer's context inside that slice), reading only the
    /// elements the part names (and a local element holding a dot the part carries under
    /// another element). The parts' inflation is taken batch by batch as usual; the set's
    /// removals and its changed key wait for [`RangeJoin::close_set`], as one join of the whole
    /// set reports them. Returns the elements held at once (the part's and the local ones).
    ///
    /// # Errors
    /// Backend failures (the caller discards its transaction).
    pub fn join_set_part<R: SetRows>(
        &mut self,
        rows: &mut R,
        ctx: &CausalContext,
        key: &Key,
        theirs: DotMap<String, DotSet>,
        slice_ctx: &CausalContext,
    ) -> Result<usize, R::Error> {
        let mut open = match self.open_set.take() {
            Some(o) if o.key == *key => o,
            other => {
                // Another set left open (its parts' checks make the caller close it first).
                self.open_set = other;
                self.report_set();
                OpenSet {
                    key: key.clone(),
                    removed: CausalContext::new(),
                    changed: false,
                    held_before: rows.set_held(key)?,
                    carried: CausalContext::new(),
                }
            }
        };
        let mut names: Vec<String> = theirs.keys().cloned().collect();
        if open.held_before {
            let mut seen = Vec::new();
            theirs.for_each_dot(&mut |d| {
                if ctx.contains(&d) {
                    seen.push(d);
                }
            });
            if !seen.is_empty() {
                let mut elsewhere = rows.dot_elems(key, &seen)?;
                elsewhere.retain(|n| theirs.get(n).is_none());
                names.extend(elsewhere);
                names.sort_unstable();
                names.dedup();
            }
        }
        open.carried.join(&theirs.dots());
        let old = Entry::ORSet(rows.set_elems(key, &names)?);
        drop(names);
        let held = theirs.len().saturating_add(match &old {
            Entry::ORSet(m) => m.len(),
            _ => 0,
        });
        let theirs = Entry::ORSet(theirs);
        let mut unseen = theirs.unseen_by(ctx);
        let overriding = theirs.overriding(&old);
        if !overriding.is_bottom() {
            self.infl_ctx.join(&overriding.dots());
            let none = CausalContext::new();
            unseen.join(&none, overriding, &none);
        }
        let mut new = old.clone();
        new.join(ctx, theirs, slice_ctx);
        Self::put_set_part(rows, key, &old, &new, &mut open)?;
        if !unseen.is_bottom() {
            self.gained.join(&unseen.dots());
            let entry = match self.infl_store.get(key).cloned() {
                Some(mut mine) => {
                    let (a, b) = (mine.dots(), unseen.dots());
                    mine.join(&a, unseen, &b);
                    mine
                }
                None => unseen,
            };
            self.infl_store.set(key.clone(), entry);
        }
        self.open_set = Some(open);
        Ok(held)
    }

    /// Ends the large set joined by [`RangeJoin::join_set_part`] (its last part was joined):
    /// when the receiver held the set, removes the local dots inside the transfer's context
    /// `join_ctx` that no part carried, [`SET_PART_WINDOW`] elements at a time; then reports
    /// the set's changed key and the local dots its join removed (one retirement of the key,
    /// taken with the next [`RangeJoin::take_batch`], so logged with the set's last part).
    /// Returns the most elements held at once.
    ///
    /// # Errors
    /// Backend failures (the caller discards its transaction).
    pub fn close_set<R: SetRows>(
        &mut self,
        rows: &mut R,
        join_ctx: &CausalContext,
    ) -> Result<usize, R::Error> {
        let Some(mut open) = self.open_set.take() else {
            return Ok(0);
        };
        let mut held = 0;
        if open.held_before {
            let key = open.key.clone();
            let mut after: Option<String> = None;
            loop {
                let old = rows.set_elems_after(&key, after.as_deref(), SET_PART_WINDOW)?;
                let Some(last) = old.keys().last().cloned() else {
                    break;
                };
                let full = old.len() >= SET_PART_WINDOW;
                held = held.max(old.len());
                let mut new = DotMap::default();
                for (e, dots) in old.iter() {
                    let kept = dots
                        .iter()
                        .filter(|d| !join_ctx.contains(d) || open.carried.contains(d))
                        .copied()
                        .collect();
                    new.set(e.clone(), DotSet::from_dots(kept));
                }
                let (old, new) = (Entry::ORSet(old), Entry::ORSet(new));
                Self::put_set_part(rows, &key, &old, &new, &mut open)?;
                if !full {
                    break;
                }
                after = Some(last);
            }
        }
        self.open_set = Some(open);
        self.report_set();
        Ok(held)
    }

    /// Reports the open set's changed key and removals (see [`RangeJoin::close_set`]).
    pub(super) fn report_set(&mut self) {
        let Some(open) = self.open_set.take() else {
            return;
        };
        if open.changed {
            self.changed.push(&open.key);
        }
        if !open.removed.is_empty() {
            self.infl_ctx.join(&open.removed);
            self.retired.push((open.key, open.removed));
        }
    }

    /// Writes the part `new` of a set over its part `old`, noting what it removed.
    fn put_set_part<R: SetRows>(
        rows: &mut R,
        key: &Key,
        old: &Entry,
        new: &Entry,
        open: &mut OpenSet,
    ) -> Result<(), R::Error> {
        debug_assert_eq!(key.kind, KeyKind::ORSet);
        if new == old {
            return Ok(());
        }
        open.removed.join(&old.dots().diff(&new.dots()));
        let old_opt = (!old.is_bottom()).then_some(old);
        let new_opt = (!new.is_bottom()).then_some(new);
        rows.put(key, old_opt, new_opt)?;
        open.changed = true;
        Ok(())
    }
}
