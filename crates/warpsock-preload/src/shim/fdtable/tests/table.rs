use super::*;

#[test]
fn marks_and_candidates() {
    // A descriptor number no test opens.
    let fd = 60_001;
    assert_eq!(mark(fd), 0);
    set_candidate(fd, 1);
    assert_eq!(candidate_kind(mark(fd)), Some(1));
    assert!(!maybe_managed(fd));
    set_candidate(fd, 0);
    assert_eq!(mark(fd), 0);
    assert_eq!(mark(-1), 0);
    assert_eq!(candidate_kind(MANAGED | 1), None);
}

/// Descriptors below `BITS` (by index) and above it (the map): each
/// number names its own object, a replacement returns the old one, a
/// removal forgets only its number, and `all` lists exactly the
/// managed ones. Numbers no other test uses.
#[test]
fn objects_by_number_low_and_high() {
    let (low, low2, high) = (60_011, 60_013, BITS as c_int + 17);
    let (a, b, c, d) = (dummy(), dummy(), dummy(), dummy());
    assert!(get(low).is_none() && get(high).is_none());
    assert!(insert(low, a.clone()).unwrap().is_none());
    assert!(insert(low2, b.clone()).unwrap().is_none());
    assert!(insert(high, c.clone()).unwrap().is_none());
    assert!(same(&get(low), &a) && same(&get(low2), &b) && same(&get(high), &c));
    assert!(get(low + 1).is_none() && get(high + 1).is_none());
    let mine = |all: Vec<(c_int, Arc<dyn Socket>)>| {
        let mut v: Vec<c_int> = all
            .into_iter()
            .filter(|(_, s)| [&a, &b, &c, &d].iter().any(|x| Arc::ptr_eq(s, x)))
            .map(|(fd, _)| fd)
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(mine(all()), [low, low2, high]);
    assert!(same(&insert(low, d.clone()).unwrap(), &a));
    assert!(same(&get(low), &d));
    assert!(same(&remove(low2).unwrap(), &b));
    assert!(get(low2).is_none() && remove(low2).unwrap().is_none());
    assert_eq!(mark(low2), 0);
    assert!(same(&remove(high).unwrap(), &c));
    assert!(get(high).is_none());
    assert_eq!(mine(all()), [low]);
    assert!(same(&remove(low).unwrap(), &d));
    assert_eq!(mine(all()), Vec::<c_int>::new());
}
