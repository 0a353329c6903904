//! Hostile review of the record's memory bound: `limits.view_held_bytes` is documented as the
//! bytes of the record, but the forgotten-cell generations (up to `FORGOTTEN_MAX` cloned keys,
//! one per remote change of any view set cell) are kept outside the budget.

use super::*;
use tidemark_crdts::KeyKind;

#[test]
fn review_forgotten_cells_are_counted_in_the_budget() {
    let budget = 16 * 1024;
    let h = Held::new(budget);
    // View cell names run up to `key_bytes_max` (256 by default).
    for i in 0..FORGOTTEN_MAX {
        let name = format!("~view/users/0123456789abcdef/{i:08}/{}", "g".repeat(200));
        h.forget(&Key::new(KeyKind::ORSet, &name));
    }
    let inner = h.inner.lock().expect("lock");
    let forgotten: usize = inner
        .forgotten
        .keys()
        .map(|k| k.name.len() + std::mem::size_of::<Key>() + 8)
        .sum();
    assert!(
        inner.bytes + forgotten <= budget,
        "view_held_bytes = {budget} but the record keeps {} bytes of cells and {forgotten} \
         bytes of forgotten keys ({} keys)",
        inner.bytes,
        inner.forgotten.len()
    );
}
