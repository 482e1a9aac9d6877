package e2e

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/identities"
)

// confinementProbes is the universe of subjects every identity is probed
// with, each a subject or (for subscriptions only) a pattern.
func confinementProbes(t *testing.T, rows []identities.Row) []string {
	t.Helper()
	set := map[string]bool{}
	add := func(subjects ...string) {
		for _, s := range subjects {
			if !identities.ValidPattern(s) {
				t.Fatalf("probe %q is not a subject", s)
			}
			set[s] = true
			if c := concrete(s, probeToken); c != s {
				set[c] = true
			}
		}
	}
	// Every row's patterns, for this identity's values and for others'.
	for _, values := range []map[string]string{
		{identities.PlaceholderNode: confNode, identities.PlaceholderRun: confRun, identities.PlaceholderProducer: confTenant, identities.PlaceholderTenant: confTenant, identities.PlaceholderConsumer: confConsumer, identities.PlaceholderInvite: confInvite},
		{identities.PlaceholderNode: confOtherNode, identities.PlaceholderRun: confOtherRun, identities.PlaceholderProducer: confOtherTenant, identities.PlaceholderTenant: confOtherTenant, identities.PlaceholderConsumer: confOtherConsumer, identities.PlaceholderInvite: confOtherInvite},
		{identities.PlaceholderNode: confEnrolling, identities.PlaceholderRun: confRun, identities.PlaceholderProducer: confTenant, identities.PlaceholderTenant: confTenant, identities.PlaceholderConsumer: confConsumer, identities.PlaceholderInvite: confOtherInvite},
	} {
		for _, r := range rows {
			add(identities.Instantiate(r.Publish, values)...)
			add(identities.Instantiate(r.Subscribe, values)...)
		}
	}
	add(busSubjectConstants(t)...)
	for _, n := range []string{confNode, confOtherNode, confEnrolling} {
		add(bus.NodeCmd(n), bus.NodeObs(n), bus.NodeHeartbeat(n), bus.NodeRenew(n), bus.NodeRegistryCredentials(n),
			bus.NodeArtifactCredentials(n), bus.NodeDiskKeep(n), bus.NodeDiskPrune(n), bus.NodeSessions(n, probeToken),
			bus.NodeResidencyService(n, probeToken), bus.NodeInboxPrefix(n)+"."+probeToken, bus.ArtifactInboxPrefix(n)+"."+probeToken)
		for _, run := range []string{confRun, confOtherRun} {
			add(bus.NodeLogInboxPrefix(n, run) + "." + probeToken)
		}
	}
	for _, tenant := range []string{confTenant, confOtherTenant, "default"} {
		for _, run := range []string{confRun, confOtherRun} {
			add(bus.RunEventsSubject(tenant, run), bus.RunLogsSubject(tenant, run))
		}
		for _, identity := range []string{confTenant, confOtherTenant, bus.OperatorUser} {
			add(bus.SubmitSubject(tenant, identity), bus.CancelSubject(tenant, identity))
		}
		add(bus.SessionInbox(tenant, confSession), bus.SessionLogsSubject(tenant, confSession), bus.ProducerInboxPrefix(tenant)+"."+probeToken,
			bus.TenantSubject(tenant, bus.TenantRunsGet), bus.TenantSubject(tenant, bus.TenantRunsList), bus.TenantSubject(tenant, bus.TenantRunsRead))
	}
	add("_INBOX."+probeToken, bus.AuthCalloutSubject, ">", "*", "*.>", "wf.>", "$JS.>", "$JS.API.>", "$KV.>", "$O.>", "$SYS.>", "_INBOX.>", "_WF_INBOX.>",
		serverDenied+"."+probeToken, serverDenied+".>")
	add(jetStreamProbes()...)
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// jetStreamProbes are nats-server's JetStream API subjects for every
// stream, bucket and consumer the control plane provisions (bus's
// definitions), and one it does not; acks and flow control; the stores'
// own subjects and direct gets of them.
func jetStreamProbes() []string {
	// The consumers the control plane creates, on their streams; and one
	// it does not create, on every stream.
	consumers := map[string][]string{bus.StreamObs: {bus.ObsConsumerConfig().Durable}}
	tenants := []string{confTenant, confOtherTenant}
	for _, tenant := range tenants {
		consumers[bus.RunsStream(tenant)] = []string{bus.IntakeConsumerConfig().Durable}
	}
	for _, n := range []string{confNode, confOtherNode, confEnrolling} {
		consumers[bus.StreamCmds] = append(consumers[bus.StreamCmds], bus.NodeConsumerConfig(n, 0).Durable)
	}
	for _, tenant := range []string{confTenant, confOtherTenant} {
		consumers[bus.StreamInbox] = append(consumers[bus.StreamInbox], bus.InboxConsumerConfig(tenant, confSession, 0).Durable)
	}
	streams := []string{"PROBE"}
	var out []string
	seen := map[string]bool{}
	for _, st := range identities.Stores() {
		// A tenant's intake stream, once for each tenant probed.
		for _, tenant := range tenants {
			stream := strings.ReplaceAll(st.Stream, identities.PlaceholderTenant, tenant)
			if seen[stream] {
				continue
			}
			seen[stream] = true
			streams = append(streams, stream)
			for _, subj := range identities.Instantiate(st.Subjects, map[string]string{identities.PlaceholderTenant: tenant}) {
				out = append(out, subj, concrete(subj, probeToken), fmt.Sprintf(server.JSDirectGetLastBySubjectT, stream, concrete(subj, probeToken)))
			}
		}
	}
	out = append(out, server.JSApiAccountInfo, server.JSApiStreams, server.JSApiStreamList, server.JSApiLeaderStepDown,
		server.JSApiRemoveServer, server.JSApiEvacuateServer, server.JSApiMetaRescue, fmt.Sprintf(server.JSApiAccountPurgeT, "$G"))
	for _, s := range streams {
		for _, tmpl := range []string{server.JSApiStreamCreateT, server.JSApiStreamUpdateT, server.JSApiStreamInfoT, server.JSApiStreamDeleteT,
			server.JSApiStreamPurgeT, server.JSApiStreamSnapshotT, server.JSApiStreamRestoreT, server.JSApiMsgDeleteT, server.JSApiMsgGetT,
			server.JSDirectMsgGetT, server.JSApiConsumerCreateT, server.JSApiConsumersT, server.JSApiConsumerListT, server.JSApiStreamRemovePeerT,
			server.JSApiStreamEvacuatePeerT, server.JSApiStreamCancelMoveT, server.JSApiStreamLeaderStepDownT} {
			out = append(out, fmt.Sprintf(tmpl, s))
		}
		out = append(out, fmt.Sprintf(server.JSApiServerStreamMoveT, "$G", s))
		for _, c := range append([]string{probeToken}, consumers[s]...) {
			for _, tmpl := range []string{server.JSApiDurableCreateT, server.JSApiConsumerInfoT, server.JSApiConsumerDeleteT, server.JSApiConsumerPauseT,
				server.JSApiRequestNextT, server.JSApiConsumerResetT, server.JSApiConsumerUnpinT, server.JSApiConsumerLeaderStepDownT,
				server.JSApiConsumerRemovePeerT, server.JSApiConsumerEvacuatePeerT} {
				out = append(out, fmt.Sprintf(tmpl, s, c))
			}
			out = append(out, fmt.Sprintf(server.JSApiConsumerCreateExT, s, c, probeToken),
				"$JS.ACK."+s+"."+c+"."+probeToken, "$JS.FC."+s+"."+c+"."+probeToken)
		}
	}
	return out
}

// busSubjectConstants are the string constants of package bus (read from
// its source, so a subject added there is probed without a change here)
// that are subjects or subject prefixes: wf.…, $…, _….
func busSubjectConstants(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "bus", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for _, v := range spec.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil || !(strings.HasPrefix(s, "wf.") || strings.HasPrefix(s, "$") || strings.HasPrefix(s, "_")) {
					continue
				}
				if strings.HasSuffix(s, ".") {
					s += probeToken
				}
				out = append(out, s)
			}
			return true
		})
	}
	if len(out) < 20 {
		t.Fatalf("found %d subject constants in bus; the search is not looking where it should", len(out))
	}
	return out
}
