function (doc) {
  // free_slots: slot reservations that are not used, keyed
  // [sequence, expires_at, ordinal]: abandoned slots (expires_at 0) first,
  // then reservations by when they run out. Reserve reads [seq, 0] to
  // [seq, now] for slots to take again, lowest first, so that a sequence
  // keeps no gaps.
  if (doc.type !== 'SlotReservation' || doc.state === 'used' || typeof doc.sequence !== 'string') {
    return;
  }
  var expires = typeof doc.expires_at === 'number' && isFinite(doc.expires_at) ? doc.expires_at : 0;
  if (doc.state === 'free') {
    expires = 0;
  }
  emit([doc.sequence, expires, typeof doc.ordinal === 'number' ? doc.ordinal : 0], {slot: doc.slot, holder: doc.holder || null});
}
