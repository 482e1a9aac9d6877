package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/warmfleet/warmfleet/noderuntime"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/residency/nodehost"
)

// sessionFlags configure the node's session host (see residency/nodehost);
// without --session-image the node hosts no sessions.
type sessionFlags struct {
	image, compat string
	command       []string
	capacity      int
	warmTTL       time.Duration
	stopGrace     time.Duration
	checkpointIv  time.Duration
	requireCkpt   bool
	inboxAck      string
	// hooks observe the session host (its checkpoints, for metrics).
	hooks residency.Hooks
}

func addSessionFlags(f *pflag.FlagSet) *sessionFlags {
	s := &sessionFlags{}
	f.StringVar(&s.image, "session-image", "", "host sessions in this image, pinned as name@sha256:<hex> (default: host no sessions)")
	f.StringVar(&s.compat, "session-compatibility-id", "", "build id of the session runtime; durable state written by another build is not restored here (required with --session-image)")
	f.StringSliceVar(&s.command, "session-command", nil, "session container entrypoint and args (default: the image's own)")
	f.IntVar(&s.capacity, "session-capacity", 4, "most sessions resident at once")
	f.DurationVar(&s.warmTTL, "session-warm-ttl", 10*time.Minute, "release a session whose inbox stayed idle this long (0: never)")
	f.DurationVar(&s.stopGrace, "session-stop-grace", 10*time.Second, "how long a released session's container gets after SIGTERM")
	f.DurationVar(&s.checkpointIv, "session-checkpoint-interval", 5*time.Minute, "checkpoint each resident session's workspace this often, beside its release's checkpoint (0: only at release); a node lost meanwhile loses at most this much")
	f.BoolVar(&s.requireCkpt, "session-requires-checkpoint", false, "refuse to resume a session whose durable state holds no workspace checkpoint (checkpoint_required) rather than start it on an empty workspace")
	f.StringVar(&s.inboxAck, "session-inbox-ack", string(nodehost.AckWhenDone), "when an inbox message is acked: done (once the session's runtime removed workspace/inbox/<message id>) or written (once that file is there)")
	return s
}

// host builds the session host, or nil when sessions are off.
func (s *sessionFlags) host(dataDir string) (noderuntime.SessionHost, error) {
	if s.image == "" {
		return nil, nil
	}
	_, digest, ok := strings.Cut(s.image, "@")
	if !ok || !strings.HasPrefix(digest, "sha256:") {
		return nil, fmt.Errorf("--session-image %q: pin it as name@sha256:<hex>", s.image)
	}
	if s.compat == "" {
		return nil, fmt.Errorf("--session-compatibility-id is required with --session-image")
	}
	ack := nodehost.InboxAck(s.inboxAck)
	if ack.Validate() != nil {
		return nil, fmt.Errorf("--session-inbox-ack %q: use %s or %s", s.inboxAck, nodehost.AckWhenDone, nodehost.AckWhenWritten)
	}
	root, err := filepath.Abs(filepath.Join(dataDir, "sessions"))
	if err != nil {
		return nil, err
	}
	return nodehost.New(nodehost.Options{
		Target: residency.RuntimeTarget{Image: s.image, ManifestDigest: digest, Command: s.command, CompatibilityID: s.compat, StopGrace: s.stopGrace,
			RequiresCheckpoint: s.requireCkpt},
		Capacity: s.capacity, WorkspaceRoot: root, WarmTTL: s.warmTTL, CheckpointInterval: s.checkpointIv, Hooks: s.hooks,
		InboxAck: ack,
	})
}
