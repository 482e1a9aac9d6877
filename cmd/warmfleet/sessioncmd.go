package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/sessions"
	"github.com/warmfleet/warmfleet/residency"
	"github.com/warmfleet/warmfleet/schemas"
)

// sessionRow is one session as `warmfleet session list|get` shows it: its
// route in wf_residency, its lease in wf_leases and its durable state in
// wf_sessions.
type sessionRow struct {
	Key       residency.Key            `json:"key"`
	Route     *residency.Observation   `json:"route,omitempty"`
	Lease     *residency.LeaseRecord   `json:"lease,omitempty"`
	LeaseLive bool                     `json:"lease_live"`
	State     *residency.SessionRecord `json:"state,omitempty"`
}

// tenantNamed says whether --tenant or WARMFLEET_TENANT named a tenant,
// rather than the default standing in.
func tenantNamed(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("tenant") || os.Getenv(envTenant) != ""
}

// sessionKey is the session arg names: TENANT.SESSION (or TENANT/SESSION),
// or SESSION in --tenant's tenant. A tenant named both ways must agree.
func sessionKey(cmd *cobra.Command, g *globals, arg string) (residency.Key, error) {
	tenant, session, ok := strings.Cut(arg, ".")
	if !ok {
		tenant, session, ok = strings.Cut(arg, "/")
	}
	if !ok {
		tenant, session = g.tenant, arg
	} else if tenantNamed(cmd) && tenant != g.tenant {
		return residency.Key{}, fmt.Errorf("%q names tenant %s, but --tenant (or WARMFLEET_TENANT) says %s: name it one way", arg, tenant, g.tenant)
	}
	k := residency.Key{Tenant: tenant, Session: session}
	if err := schemas.ValidateTenant("tenant", tenant); err != nil {
		return k, fmt.Errorf("session %q: tenant %q: %w", arg, tenant, err)
	}
	if err := k.Validate(); err != nil {
		return k, fmt.Errorf("session %q: %w; name a session as SESSION with --tenant, or TENANT.SESSION", arg, err)
	}
	return k, nil
}

func newSessionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "List, inspect, attach and release resident sessions"}
	var node string
	var all bool
	list := &cobra.Command{
		Use: "list", Short: "List sessions with a route in wf_residency (released ones with --all); every tenant's unless --tenant names one",
		RunE: func(cmd *cobra.Command, _ []string) error {
			only := ""
			if tenantNamed(cmd) {
				if err := schemas.ValidateTenant("tenant", g.tenant); err != nil {
					return fmt.Errorf("--tenant %q: %w", g.tenant, err)
				}
				only = g.tenant
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			routes, err := sessions.ListRoutes(cmd.Context(), conn.JS)
			if err != nil {
				return err
			}
			rows := []sessionRow{}
			for _, o := range routes {
				if (node != "" && o.Host != node) || (only != "" && o.Tenant != only) || (!all && o.State == residency.StateExpired) {
					continue
				}
				r, err := readSession(cmd.Context(), conn, o.Key())
				if err != nil {
					return err
				}
				rows = append(rows, r)
			}
			return g.render(cmd.OutOrStdout(), rows, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "SESSION\tHOST\tSTATE\tEPOCH\tACCEPTING\tLEASE\tCHECKPOINT\tOBSERVED")
				for _, r := range rows {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\t%s\t%s\t%s\n", r.Key, r.Route.Host, r.Route.State, r.Route.Epoch, r.Route.Accepting,
						leaseText(r), checkpointText(r), r.Route.ObservedAt.UTC().Format(time.RFC3339))
				}
			})
		},
	}
	list.Flags().StringVar(&node, "node", "", "only sessions routed to this node")
	list.Flags().BoolVar(&all, "all", false, "include released sessions (expired tombstones)")

	get := &cobra.Command{
		Use: "get [TENANT.]SESSION", Short: "Show a session's route, lease and durable state", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := sessionKey(cmd, g, args[0])
			if err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			r, err := readSession(cmd.Context(), conn, key)
			if err != nil {
				return err
			}
			if r.Route == nil && r.Lease == nil && r.State == nil {
				return fmt.Errorf("no session %s; `warmfleet session list --all` shows them", key)
			}
			return g.render(cmd.OutOrStdout(), r, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "Session:\t%s\n", r.Key)
				if o := r.Route; o != nil {
					fmt.Fprintf(tw, "Host:\t%s\nState:\t%s\nEpoch:\t%d\nAccepting:\t%v\nWorkload:\t%s\nObserved:\t%s\n", o.Host, o.State, o.Epoch, o.Accepting,
						or(o.Workload, "-"), o.ObservedAt.UTC().Format(time.RFC3339))
				} else {
					fmt.Fprintf(tw, "Route:\tnone\n")
				}
				fmt.Fprintf(tw, "Lease:\t%s\n", leaseText(r))
				if s := r.State; s != nil {
					fmt.Fprintf(tw, "Namespace:\t%s\nCompatibility id:\t%s\nCheckpoint:\t%d (epoch %d, by %s at %s)\nWorkspace:\t%s\n", s.Namespace, s.CompatibilityID,
						s.CheckpointSequence, s.Epoch, s.Host, s.UpdatedAt.UTC().Format(time.RFC3339), workspaceText(s.Checkpoint, time.Now()))
					if len(s.Recent) > 0 {
						fmt.Fprintf(tw, "Kept checkpoints:\t%s\n", keptText(s.Recent))
					}
				} else {
					fmt.Fprintf(tw, "Durable state:\tnone\n")
				}
			})
		},
	}

	var mode, pin, compat string
	var gpus int64
	var fromCheckpoint uint64
	attach := &cobra.Command{
		Use: "attach [TENANT.]SESSION", Short: "Place a session on a ready node and make it resident there", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := sessionKey(cmd, g, args[0])
			if err != nil {
				return err
			}
			rep, err := sessionRequest(cmd.Context(), g, bus.SubjectSessionAttach, schemas.SessionRequest{
				Tenant: key.Tenant, Session: key.Session, Mode: residency.Mode(mode), Node: pin, CompatibilityID: compat, Actor: "cli", GPUCount: gpus,
				FromCheckpoint: fromCheckpoint,
			})
			if err != nil {
				return err
			}
			r := rep.Residency
			if r == nil {
				return errors.New("attach reply carried no residency")
			}
			return g.render(cmd.OutOrStdout(), r, func(tw *tabwriter.Writer) {
				verb := "attached"
				if !r.Attached {
					verb = "already resident"
				}
				fmt.Fprintf(tw, "session %s %s on %s at epoch %d (workload %s)\n", key, verb, r.Host, r.Epoch, r.Workload)
			})
		},
	}
	attach.Flags().StringVar(&mode, "mode", "", "create or resume; resume when the session has durable state, else create")
	attach.Flags().StringVar(&pin, "node", "", "attach on this node only")
	attach.Flags().StringVar(&compat, "compatibility-id", "", "refuse a node whose session runtime is another build")
	attach.Flags().Int64Var(&gpus, "gpus", 0, "GPUs the session holds while resident, booked on its node like a Run's")
	attach.Flags().Uint64Var(&fromCheckpoint, "from-checkpoint", 0, "restore this kept workspace checkpoint (a sequence `session get` lists) instead of the latest, e.g. when the latest is damaged")

	release := &cobra.Command{
		Use: "release [TENANT.]SESSION", Short: "Release a resident session gracefully (checkpoint, stop, tombstone, drop lease)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := sessionKey(cmd, g, args[0])
			if err != nil {
				return err
			}
			if _, err := sessionRequest(cmd.Context(), g, bus.SubjectSessionRelease, schemas.SessionRequest{Tenant: key.Tenant, Session: key.Session}); err != nil {
				return err
			}
			return g.render(cmd.OutOrStdout(), map[string]any{"released": key}, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "session %s released\n", key)
			})
		},
	}
	cmd.AddCommand(list, get, attach, release, sessionEventsCmd(g))
	return cmd
}

// sessionRequest asks the control plane and returns its reply, or the error
// it carried.
func sessionRequest(ctx context.Context, g *globals, subject string, req schemas.SessionRequest) (schemas.SessionReply, error) {
	conn, err := g.connect(ctx)
	if err != nil {
		return schemas.SessionReply{}, err
	}
	defer conn.Close()
	b, err := json.Marshal(req)
	if err != nil {
		return schemas.SessionReply{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	resp, err := conn.NC.RequestWithContext(rctx, subject, b)
	if err != nil {
		return schemas.SessionReply{}, fmt.Errorf("no control plane answered on %s: %w", subject, err)
	}
	var rep schemas.SessionReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return rep, fmt.Errorf("reply on %s: %w", subject, err)
	}
	if rep.Error != nil {
		return rep, residency.ErrorFromWire(rep.Error)
	}
	return rep, nil
}

// readSession reads a session's route, lease and durable state; any may be
// missing.
func readSession(ctx context.Context, conn *bus.Conn, key residency.Key) (sessionRow, error) {
	r := sessionRow{Key: key}
	var o residency.Observation
	if err := readOptional(ctx, conn, bus.BucketResidency, key.String(), &o); err == nil {
		r.Route = &o
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, err
	}
	var l residency.LeaseRecord
	if err := readOptional(ctx, conn, bus.BucketLeases, key.String(), &l); err == nil {
		r.Lease, r.LeaseLive = &l, l.Live(time.Now())
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, err
	}
	var s residency.SessionRecord
	if err := readOptional(ctx, conn, bus.BucketSessions, key.String(), &s); err == nil {
		r.State = &s
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, err
	}
	return r, nil
}

func readOptional(ctx context.Context, conn *bus.Conn, bucket, key string, v any) error {
	kv, err := conn.JS.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	_, err = bus.GetJSON(ctx, kv, key, v)
	return err
}

func leaseText(r sessionRow) string {
	l := r.Lease
	switch {
	case l == nil:
		return "-"
	case r.LeaseLive:
		return fmt.Sprintf("held by %s, epoch %d, until %s", l.Holder, l.Epoch, l.ExpiresAt.UTC().Format(time.RFC3339))
	case l.Released:
		return fmt.Sprintf("released by %s at epoch %d", l.Holder, l.Epoch)
	default:
		return fmt.Sprintf("expired (%s, epoch %d)", l.Holder, l.Epoch)
	}
}

func checkpointText(r sessionRow) string {
	if r.State == nil {
		return "-"
	}
	if r.State.Checkpoint == nil {
		return fmt.Sprintf("%d (no workspace)", r.State.CheckpointSequence)
	}
	return fmt.Sprintf("%d", r.State.CheckpointSequence)
}

// workspaceText says what the latest checkpoint holds of the workspace:
// its size, its age at now, and what taking it sent.
func workspaceText(c *schemas.CheckpointSummary, now time.Time) string {
	if c == nil {
		return "not checkpointed: the session resumes on an empty workspace"
	}
	files := "files"
	if c.Files == 1 {
		files = "file"
	}
	return fmt.Sprintf("%d %s, %s, taken %s ago in %.1fs (%s sent)", c.Files, files, schemas.FormatBytes(c.Bytes),
		now.Sub(c.TakenAt).Round(time.Second), c.Seconds, schemas.FormatBytes(c.BytesMoved))
}

// keptText lists the kept workspace checkpoints, newest first: what
// `session attach --from-checkpoint` may restore.
func keptText(recent []schemas.CheckpointRef) string {
	seqs := make([]string, 0, len(recent))
	for i := len(recent) - 1; i >= 0; i-- {
		seqs = append(seqs, strconv.FormatUint(recent[i].Sequence, 10))
	}
	return strings.Join(seqs, ", ")
}

// printDrainSessions reports a node drain's sessions: what was released and
// what could not be, with why.
func printDrainSessions(w io.Writer, v *schemas.DrainView) {
	if v == nil {
		return
	}
	if v.Error != nil && v.Error.Code != residency.CodeNoHost {
		fmt.Fprintf(w, "session drain on %s did not complete: %v\n", v.Node, v.Error)
	}
	for _, k := range v.Released {
		fmt.Fprintf(w, "session %s released\n", residency.KeyOf(k))
	}
	for _, f := range v.Failures {
		fmt.Fprintf(w, "session %s NOT released: %s", residency.KeyOf(f.Key), f.Reason)
		if len(f.Unwritten) > 0 {
			fmt.Fprintf(w, " (still held: %s)", strings.Join(f.Unwritten, ", "))
		}
		fmt.Fprintln(w)
	}
}

// drainNode asks the control plane to drain a node and returns its reply,
// the node record and the node's session drain.
func drainNode(ctx context.Context, conn *bus.Conn, id string) (schemas.NodeDrainReply, error) {
	var rep schemas.NodeDrainReply
	b, err := json.Marshal(schemas.AdminRequest{ID: id})
	if err != nil {
		return rep, err
	}
	resp, err := conn.NC.RequestWithContext(ctx, bus.SubjectDrain, b)
	if err != nil {
		return rep, fmt.Errorf("no control plane answered on %s: %w", bus.SubjectDrain, err)
	}
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return rep, fmt.Errorf("reply on %s: %w", bus.SubjectDrain, err)
	}
	if rep.Refusal != nil {
		return rep, rep.Refusal
	}
	if rep.OK == nil {
		return rep, errors.New("empty reply on " + bus.SubjectDrain)
	}
	return rep, nil
}
