package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

const submitLong = `Submit a Run, from -f request.json or from flags, and print its id.

With --wait, follow the Run until it ends, as docker run does: its stdout
goes to stdout and its stderr to stderr as they arrive (read from WF_LOGS
as 'warmfleet run logs -f' reads them), warmfleet's own progress lines go
to stderr, each starting "warmfleet:", so 'run submit --wait > out.txt'
keeps only the Run's output; with -o json each line of output is one JSON
object on stdout, as in 'run logs -o json'. --quiet shows the Run's events
on stdout instead of its output.

--artifact NAME[:VERSION|@sha256:<hex>]=PATH mounts a catalog artifact
read-only at PATH (repeatable; NAME alone is its newest version), e.g.
--artifact llama-8b:v1=/models/llama. With -f, list artifacts in the
request's "artifacts" instead.

--secret-env NAME=SECRET and --secret-file SECRET=PATH[:MODE] hand the
tenant's secrets (warmfleet secret set) to the workload at launch, as an
env var or a read-only file; only the names are stored with the Run. Plain
--env is stored as given: a name that looks like a secret's gets a warning.

--priority names a class of the control plane's scheduling policy;
--preemptible lets a higher class stop the Run and requeue it;
--retry-on oom,node_lost --max-attempts 3 --retry-backoff 30s retries
those endings; --start-deadline 10m fails a Run not started by then
(docs/scheduling.md).

Exit status:
  0    submitted; with --wait, the Run succeeded
  N    with --wait, the Run's own non-zero exit code
  125  warmfleet failed (a bad flag, no NATS, a refused request, following
       was interrupted), or with --wait the Run ended without an exit code
       of its own (rejected, unsatisfiable, cancelled before it started,
       failed to prepare or launch, lost); stderr says which`

// submitFlags are run submit's flags.
type submitFlags struct {
	file, requestID, image, network string
	env, artifacts                  []string
	secretEnv, secretFiles          []string
	cpu, mem, gpus, maxRuntime, shm int64
	wait, quiet                     bool
	sched                           schedulingFlags
}

func newRunSubmit(g *globals) *cobra.Command {
	var f submitFlags
	cmd := &cobra.Command{
		Use:   "submit [flags] [-- command args...]",
		Short: "Submit a Run (from -f request.json or from flags); --wait prints its output and exits with its exit code",
		Long:  submitLong,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := submit(cmd, g, f, args); err != nil {
				var st *exitStatus
				if errors.As(err, &st) {
					return err
				}
				return &exitStatus{code: exitNoRunCode, err: err}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitStatus{code: exitNoRunCode, err: err} })
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "RunRequest as JSON")
	fl.StringVar(&f.requestID, "request-id", "", "idempotency key (default: generated)")
	fl.StringVar(&f.image, "image", "", "image pinned by digest: name@sha256:<hex>")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "KEY=VALUE (repeatable)")
	fl.StringArrayVar(&f.artifacts, "artifact", nil, "NAME[:VERSION|@sha256:<hex>]=PATH: mount a catalog artifact read-only at PATH (repeatable; NAME alone: its newest version)")
	fl.StringArrayVar(&f.secretEnv, "secret-env", nil, "NAME=SECRET: env var NAME set at launch to the tenant's secret SECRET (repeatable; never stored with the Run)")
	fl.StringArrayVar(&f.secretFiles, "secret-file", nil, "SECRET=PATH[:MODE]: the tenant's secret as a read-only file at PATH, octal MODE (default 0400) (repeatable)")
	fl.Int64Var(&f.cpu, "cpu-millis", 0, "CPU to reserve, in millicores")
	fl.Int64Var(&f.mem, "memory-bytes", 0, "memory to reserve and limit, in bytes")
	fl.Int64Var(&f.gpus, "gpus", 0, "GPUs to reserve")
	fl.Int64Var(&f.maxRuntime, "max-runtime", 0, "seconds before the Run is stopped (0: no limit)")
	fl.StringVar(&f.network, "network", "", "bridge (default), host or none")
	fl.Int64Var(&f.shm, "shm-bytes", 0, "size of /dev/shm (default: half the memory limit, or 1 GiB); ulimits need -f")
	fl.BoolVarP(&f.wait, "wait", "w", false, "follow the Run until it ends: its output, then its exit code as this command's")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "with --wait, show the Run's events instead of its output")
	f.sched.register(fl)
	return cmd
}

// submit publishes the Run and, with --wait, follows it.
func submit(cmd *cobra.Command, g *globals, f submitFlags, args []string) error {
	if f.quiet && !f.wait {
		return errors.New("--quiet chooses what --wait shows (the Run's events, not its output): add --wait, or leave --quiet out")
	}
	req, err := f.request(args)
	if err != nil {
		return err
	}
	if err := schemas.ValidateTenant("--tenant", g.tenant); err != nil {
		return err
	}
	warnSecretEnv(cmd.ErrOrStderr(), req.Env)
	conn, err := g.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer conn.Close()
	b, _ := json.Marshal(req)
	m := &nats.Msg{Subject: bus.SubmitSubject(g.tenant, g.identity()), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	if err := publishIntake(cmd.Context(), g, conn, m, req.RequestID); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	runID := schemas.RunIDFor(g.tenant, req.RequestID)
	submitted := fmt.Sprintf("submitted %s as run %s", req.RequestID, runID)
	switch {
	case !f.wait:
		fmt.Fprintln(cmd.OutOrStdout(), submitted)
		return nil
	case f.quiet:
		fmt.Fprintln(cmd.OutOrStdout(), submitted)
		return followEvents(cmd.Context(), cmd.OutOrStdout(), g, conn, runID)
	}
	stderr := &lockedWriter{w: cmd.ErrOrStderr()}
	fmt.Fprintln(stderr, "warmfleet: "+submitted)
	return attachRun(cmd.Context(), g.history(conn), runID, &logPrinter{out: cmd.OutOrStdout(), errw: stderr, headerTo: stderr,
		runID: runID, json: g.output == "json"}, stderr)
}

// request builds the RunRequest from -f or the flags and checks it; a
// refusal about an --artifact names that flag.
func (f submitFlags) request(args []string) (schemas.RunRequest, error) {
	if f.file != "" {
		if len(f.secretEnv)+len(f.secretFiles) > 0 {
			return schemas.RunRequest{}, fmt.Errorf("--secret-env and --secret-file exclude -f: list them in %s's \"secret_env\" and \"secret_files\"", f.file)
		}
		if len(f.artifacts) > 0 {
			return schemas.RunRequest{}, fmt.Errorf("--artifact and -f exclude each other: list the artifacts in %s's \"artifacts\" ([{\"name\": …, \"path\": …}])", f.file)
		}
		if f.sched.set() {
			return schemas.RunRequest{}, fmt.Errorf("--priority, --preemptible, --retry-*, --max-attempts, --start-deadline and --grace exclude -f: set them in %s (\"priority\", \"preemptible\", \"retry\", \"start_deadline_seconds\", \"grace_seconds\")", f.file)
		}
		var req schemas.RunRequest
		b, err := os.ReadFile(f.file)
		if err != nil {
			return req, err
		}
		if err := codec.Decode(codec.JSON, b, &req); err != nil {
			return req, fmt.Errorf("%s: %w", f.file, err)
		}
		return req, req.Validate()
	}
	req := schemas.RunRequest{RequestID: f.requestID, Image: f.image, Command: args,
		Resources: schemas.Resources{CPUMillis: f.cpu, MemoryBytes: f.mem, GPUCount: f.gpus}, MaxRuntimeSeconds: f.maxRuntime,
		Network: f.network, ShmBytes: f.shm}
	if req.RequestID == "" {
		req.RequestID = fmt.Sprintf("cli-%d", time.Now().UnixNano())
	}
	for _, kv := range f.env {
		k, v, _ := strings.Cut(kv, "=")
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if err := f.secretRefs(&req); err != nil {
		return req, err
	}
	if err := f.sched.apply(&req); err != nil {
		return req, err
	}
	for _, arg := range f.artifacts {
		u, err := artifactFlag(arg)
		if err != nil {
			return req, err
		}
		req.Artifacts = append(req.Artifacts, u)
	}
	err := req.Validate()
	if flag := schedulingFlagOf(err); flag != "" {
		return req, fmt.Errorf("%s: %w", flag, err)
	}
	var r *schemas.Refusal
	if errors.As(err, &r) && strings.HasPrefix(r.Field, "artifacts") {
		var i int
		if _, serr := fmt.Sscanf(r.Field, "artifacts[%d]", &i); serr == nil && i >= 0 && i < len(f.artifacts) {
			return req, fmt.Errorf("--artifact %q: %w", f.artifacts[i], err)
		}
		return req, fmt.Errorf("--artifact: %w", err)
	}
	return req, err
}

// artifactFlag reads one --artifact NAME[:VERSION|@sha256:<hex>]=PATH.
func artifactFlag(arg string) (schemas.ArtifactUse, error) {
	ref, path, ok := strings.Cut(arg, "=")
	if !ok || ref == "" || path == "" {
		return schemas.ArtifactUse{}, fmt.Errorf("--artifact %q: give NAME[:VERSION|@sha256:<hex>]=PATH, the catalog artifact and the absolute path to mount it at in the container, e.g. --artifact llama-8b:v1=/models/llama", arg)
	}
	u, err := schemas.ParseArtifactRef("artifact", ref)
	if err != nil {
		return u, fmt.Errorf("--artifact %q: %w", arg, err)
	}
	u.Path = path
	return u, nil
}
