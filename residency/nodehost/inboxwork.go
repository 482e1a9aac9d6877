package nodehost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/residency"
)

// InboxAck says when the default inbox handler acks a message.
type InboxAck string

const (
	// AckWhenDone acks once the session's runtime removed the message's
	// file from the workspace inbox: its signal that the work is finished.
	// The zero value means this.
	AckWhenDone InboxAck = "done"
	// AckWhenWritten acks once the message's file is in the workspace
	// inbox, for a runtime that keeps no work in flight.
	AckWhenWritten InboxAck = "written"
)

// Validate refuses an InboxAck that is neither mode.
func (a InboxAck) Validate() error {
	switch a {
	case "", AckWhenDone, AckWhenWritten:
		return nil
	}
	return &residency.InvalidOptionsError{Field: "InboxAck", Reason: fmt.Sprintf("%q is not %q or %q", string(a), AckWhenDone, AckWhenWritten)}
}

// How often a handler waiting on the runtime looks for the finished work,
// and tells the inbox it is still in progress (well within any AckWait).
const (
	donePoll       = 25 * time.Millisecond
	progressPeriod = time.Second
)

// WorkspaceHandler hands each inbox message to the session's runtime
// through its workspace: the body is written to
// <root>/<tenant>/<session>/inbox/<message id> (the container sees it under
// its workspace mount) after the fence is checked. With AckWhenWritten
// that is the end of it. With AckWhenDone the handler then waits for the
// runtime to remove (or move away) that file, keeping the message in
// progress meanwhile; if consumption stops or the grant is lost first, the
// message goes back to the inbox and the next holder delivers it again.
// A redelivered message is written under the same name, so a runtime that
// keys its effects by the file's name makes each effect once.
func WorkspaceHandler(root string, ack InboxAck) residency.Handler {
	return func(ctx context.Context, w residency.Work) error {
		path, err := deliver(ctx, root, w)
		if err != nil || ack == AckWhenWritten {
			return err
		}
		return awaitDone(ctx, w, path)
	}
}

// deliver writes w into the session's workspace inbox under the fence and
// returns the file's path.
func deliver(ctx context.Context, root string, w residency.Work) (string, error) {
	if err := w.Guard.Check(); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	name := w.MsgID
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." || strings.HasPrefix(name, ".") {
		name = fmt.Sprintf("nomsgid-%d", time.Now().UnixNano())
	}
	dir := filepath.Join(root, w.Key.Tenant, w.Key.Session, "inbox")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("nodehost: inbox dir: %w", err)
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, w.Data, 0o600); err != nil {
		return "", fmt.Errorf("nodehost: write work: %w", err)
	}
	if err := w.Guard.Check(); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	path := filepath.Join(dir, name)
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("nodehost: deliver work: %w", err)
	}
	return path, nil
}

// awaitDone waits for the runtime to take path away.
func awaitDone(ctx context.Context, w residency.Work, path string) error {
	poll := time.NewTicker(donePoll)
	defer poll.Stop()
	lastProgress := time.Now()
	for {
		_, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nodehost: look for finished work %s: %w", w.MsgID, err)
		}
		if err := w.Guard.Check(); err != nil {
			return err
		}
		if time.Since(lastProgress) >= progressPeriod && w.InProgress != nil {
			// A lost progress signal costs at most a redelivery after
			// AckWait, which the fence and the message id make harmless.
			_ = w.InProgress()
			lastProgress = time.Now()
		}
		select {
		case <-poll.C:
		case <-w.Stopping:
			return fmt.Errorf("nodehost: %s still in the workspace inbox when consumption stopped: %w", w.MsgID, residency.ErrWorkUnfinished)
		case <-ctx.Done():
			return fmt.Errorf("nodehost: waiting for %s: %w (%w)", w.MsgID, residency.ErrWorkUnfinished, ctx.Err())
		}
	}
}
