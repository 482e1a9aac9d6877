package residency

import (
	"errors"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// The session protocol's shapes (commands, replies, views and the error a
// reply carries) are schemas' (schemas/session.go); this file turns this
// package's values and errors into them and back.

// WireError is a session error that came in a reply: errors.Is matches the
// sentinel its code stands for. ToWire and WireError.Unwrap translate
// between a code and its sentinel through the one table, sentinelCodes
// (errors.go), so errors.Is works across the wire.
type WireError struct {
	schemas.SessionError
}

// Unwrap is the sentinel the code stands for, if any.
func (e *WireError) Unwrap() error { return sentinelOf(e.Code) }

// ToWire encodes err for a reply; nil stays nil.
func ToWire(err error) *schemas.SessionError {
	if err == nil {
		return nil
	}
	var we *WireError
	if errors.As(err, &we) {
		w := we.SessionError
		return &w
	}
	var se *schemas.SessionError
	if errors.As(err, &se) {
		return se
	}
	w := &schemas.SessionError{Code: CodeUnavailable, Message: err.Error()}
	var rst *RestoreError
	if errors.As(err, &rst) {
		w.PreviousCheckpoint = rst.Previous
	}
	var ae *AttachError
	if errors.As(err, &ae) {
		w.Code, w.Step, w.Unreleased = ae.Code, ae.Step.String(), ae.Unreleased
		return w
	}
	if c, ok := codeOf(err); ok {
		w.Code = c
	}
	var re *ReleaseError
	if errors.As(err, &re) {
		if w.Code == CodeUnavailable {
			w.Code = CodeReleaseError
		}
		w.Unwritten = re.Unwritten
	}
	return w
}

// ErrorFromWire is the error a reply carried, matching its code's
// sentinel; nil stays nil.
func ErrorFromWire(w *schemas.SessionError) error {
	if w == nil {
		return nil
	}
	return &WireError{SessionError: *w}
}

// WireKey is k as it travels.
func WireKey(k Key) schemas.SessionKey { return schemas.SessionKey(k) }

// KeyOf is the session a wire key names.
func KeyOf(k schemas.SessionKey) Key { return Key(k) }

// ViewOf is r as a ResidencyView.
func ViewOf(r Residency) schemas.ResidencyView {
	return schemas.ResidencyView{Tenant: r.Key.Tenant, Session: r.Key.Session, Host: r.Host, Epoch: r.Epoch, Generation: r.Generation,
		Phase: schemas.ResidencyPhase(r.Phase), Workload: r.Workload, Namespace: r.Namespace, CompatibilityID: r.CompatibilityID, Attached: r.Attached,
		Restored: r.Restored}
}

// DrainViewOf is rep as a DrainView.
func DrainViewOf(node string, rep DrainReport) schemas.DrainView {
	v := schemas.DrainView{Node: node, Released: wireKeys(rep.Released), Gone: wireKeys(rep.Gone)}
	if v.Released == nil {
		v.Released = []schemas.SessionKey{}
	}
	for _, f := range rep.Failures {
		reason := "release failed"
		if f.Cause != nil {
			reason = f.Cause.Error()
		}
		v.Failures = append(v.Failures, schemas.DrainFailure{Key: WireKey(f.Key), Unwritten: f.Unwritten, Reason: reason})
	}
	return v
}

func wireKeys(ks []Key) []schemas.SessionKey {
	if ks == nil {
		return nil
	}
	out := make([]schemas.SessionKey, len(ks))
	for i, k := range ks {
		out[i] = WireKey(k)
	}
	return out
}

// DefaultRequestTimeout bounds one request/reply exchange of this package.
const DefaultRequestTimeout = 10 * time.Second
