package residency

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// SessionRecord is a session's durable state as stored in wf_sessions under
// `<tenant>.<session>` (JSON, so `nats kv get wf_sessions acme.s1` reads it).
// It outlives every residency; only the control plane writes it.
type SessionRecord = schemas.SessionRecord

// NamespaceFor is the object prefix of a session's durable objects. It is a
// property of the identities, so a session with no record has one too.
func NamespaceFor(key Key) string { return "sessions/" + key.Tenant + "/" + key.Session }

// KVSessionsOptions configures KVSessions.
type KVSessionsOptions = StoreOptions

// KVSessions is the control plane's DurableStore over wf_sessions.
//
// The runtime journal state it answers for a session with no record comes
// from wf_leases: no lease beyond epoch 1 was ever granted for the key (the
// attach asking holds epoch 1, or none), so no runtime ran under it before
// and the journal is empty; a later epoch means an earlier residency ran and
// never recorded anything, so what its runtime wrote is unknown — a create
// is then refused (fail closed).
type KVSessions struct {
	leasedBucket
	// keep and dropped are KeepCheckpoints'.
	keep    int
	dropped func(key Key, drop, keep []schemas.CheckpointRef)
}

// KeepCheckpoints makes each session's record list its latest n
// checkpoints that saved a workspace (SessionRecord.Recent); a commit that
// pushes older ones out calls dropped with them and with those kept, once
// its write has landed. Call it before the store is used.
func (s *KVSessions) KeepCheckpoints(n int, dropped func(key Key, drop, keep []schemas.CheckpointRef)) {
	s.keep, s.dropped = n, dropped
}

var _ DurableStore = (*KVSessions)(nil)

// NewKVSessions binds wf_sessions and wf_leases (bus.Provision creates them).
func NewKVSessions(ctx context.Context, o KVSessionsOptions) (*KVSessions, error) {
	b, err := bindLeased(ctx, o.JS, bus.BucketSessions, o.Clock, o.Logger, "sessions")
	if err != nil {
		return nil, err
	}
	return &KVSessions{leasedBucket: b}, nil
}

// Get reads a session's record and its revision.
func (s *KVSessions) Get(ctx context.Context, key Key) (SessionRecord, uint64, error) {
	var rec SessionRecord
	rev, err := bus.GetJSON(ctx, s.kv, key.String(), &rec)
	return rec, rev, err
}

// LoadSessionState implements DurableStore.
func (s *KVSessions) LoadSessionState(ctx context.Context, key Key) (SessionState, error) {
	if err := key.Validate(); err != nil {
		return SessionState{}, err
	}
	rec, _, err := s.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		st := SessionState{Namespace: NamespaceFor(key), RuntimeJournal: JournalEmpty}
		var lr LeaseRecord
		_, lerr := bus.GetJSON(ctx, s.leases, key.String(), &lr)
		switch {
		case lerr == nil && lr.Epoch > 1:
			// An earlier residency ran and never recorded anything.
			st.RuntimeJournal = JournalUnknown
		case lerr == nil:
			// Epoch 1 is the attach asking now: nothing ran before it.
		case !errors.Is(lerr, jetstream.ErrKeyNotFound):
			return SessionState{}, fmt.Errorf("residency: read lease %s: %w", key, lerr)
		}
		return st, nil
	case err != nil:
		return SessionState{}, fmt.Errorf("residency: read session %s: %w", key, err)
	}
	return SessionState{
		Exists: true, Namespace: rec.Namespace, CompatibilityID: rec.CompatibilityID, RuntimeJournal: JournalPresent,
		HasCheckpoint: rec.CheckpointSequence > 0, CheckpointSequence: rec.CheckpointSequence,
		CheckpointEpoch: rec.Epoch, Checkpoint: rec.Checkpoint, EarlierCheckpoints: earlier(rec),
	}, nil
}

// earlier is rec's kept workspace checkpoints before its latest, newest
// first.
func earlier(rec SessionRecord) []schemas.CheckpointRef {
	var out []schemas.CheckpointRef
	for i := len(rec.Recent) - 1; i >= 0; i-- {
		if r := rec.Recent[i]; r.Sequence < rec.CheckpointSequence {
			out = append(out, r)
		}
	}
	return out
}

// CommitCheckpoint implements DurableStore: read → compare epochs →
// Create or Update(rev), retried on a conflict. A checkpoint under an epoch
// lower than the stored one is refused with ErrEpochSuperseded, as is one
// whose epoch the session's lease has moved past; and one from a host that
// does not hold the lease at exactly its epoch, ErrNotLeaseHolder.
func (s *KVSessions) CommitCheckpoint(ctx context.Context, cp Checkpoint) error {
	key := KeyOf(cp.Key)
	if err := key.Validate(); err != nil {
		return err
	}
	if cp.Epoch == 0 || cp.Namespace == "" || cp.CompatibilityID == "" {
		return fmt.Errorf("%w: checkpoint needs an epoch, a namespace and a compatibility id", ErrInvalidRequest)
	}
	k := key.String()
	if err := s.holds(ctx, key, cp.Host, cp.Epoch); err != nil {
		return err
	}
	rec := SessionRecord{
		Tenant: key.Tenant, Session: key.Session, Namespace: cp.Namespace, CompatibilityID: cp.CompatibilityID,
		CheckpointSequence: cp.Sequence, Epoch: cp.Epoch, Host: cp.Host, UpdatedAt: s.clock.Now(), Checkpoint: cp.Content,
	}
	for range maxCASAttempts {
		cur, rev, err := s.Get(ctx, key)
		var drop []schemas.CheckpointRef
		rec.Recent, drop = s.recent(cur.Recent, cp)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = bus.CreateJSON(ctx, s.kv, k, rec)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
		case err != nil:
			return fmt.Errorf("residency: read session %s: %w", key, err)
		default:
			if cur.Epoch > cp.Epoch {
				return fmt.Errorf("%w: %s checkpoint at epoch %d < stored %d", ErrEpochSuperseded, key, cp.Epoch, cur.Epoch)
			}
			if cur.Epoch == cp.Epoch && cur.CheckpointSequence > cp.Sequence {
				return fmt.Errorf("%w: %s checkpoint %d is behind stored %d at epoch %d", ErrEpochSuperseded, key, cp.Sequence, cur.CheckpointSequence, cp.Epoch)
			}
			_, err = updateJSON(ctx, s.kv, k, rec, rev)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("residency: write session %s: %w", key, err)
		}
		s.log.Debug("checkpoint committed", zap.Stringer("key", key), zap.Uint64("sequence", cp.Sequence), zap.Uint64("epoch", uint64(cp.Epoch)))
		if len(drop) > 0 && s.dropped != nil {
			s.dropped(key, drop, rec.Recent)
		}
		return nil
	}
	return fmt.Errorf("residency: write session %s: gave up after %d conflicts", key, maxCASAttempts)
}

// recent is the session's list of checkpoints that saved a workspace once
// cp is committed, and the ones it pushes out (KeepCheckpoints).
func (s *KVSessions) recent(cur []schemas.CheckpointRef, cp Checkpoint) (keep, drop []schemas.CheckpointRef) {
	keep = slices.Clone(cur)
	if cp.Content != nil {
		keep = append(keep, schemas.CheckpointRef{Sequence: cp.Sequence, Epoch: cp.Epoch})
	}
	if s.keep > 0 && len(keep) > s.keep {
		drop, keep = keep[:len(keep)-s.keep], keep[len(keep)-s.keep:]
	}
	return keep, drop
}
