package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Authentication. With auth on, nats-server hands every login except the
// control plane's own to an auth callout run by the control plane
// (controlplane/admission). A client presents a user name and a secret:
//
//	agent, first boot: node id + the invitation's enrollment token
//	agent, enrolled:   node id + its session token
//	agent, one Run's output: NodeLogUser(node id, run id) + its session token
//	agent, one artifact fetch: ArtifactUser(node id) + a one-time token
//	producer:          producer name + its producer token
//	operator:          "operator" + the operator token
//
// and the callout answers with a NATS user carrying exactly the permissions
// of that identity (see the Perms* functions). Secrets travel only in the
// CONNECT of a connection (use TLS); NATS never stores them.

// AuthCalloutSubject is where nats-server asks the callout service to
// authorize a connection.
const AuthCalloutSubject = "$SYS.REQ.USER.AUTH"

// OperatorUser is the user name an operator logs in with.
const OperatorUser = "operator"

// inboxRoot prefixes the reply inboxes of restricted clients. It is outside
// `_INBOX.`, so no client allowed `_INBOX.>` could read their replies, and
// each identity gets its own branch, so no restricted client reads
// another's.
const inboxRoot = "_WF_INBOX."

// NodeInboxPrefix is the reply-inbox prefix of a node agent's connection.
func NodeInboxPrefix(nodeID string) string { return inboxRoot + "node." + nodeID }

// EnrollInboxRoot is the branch of node nodeID's enrolling logins' reply
// inboxes; each login's own is EnrollingInboxPrefix, one token below it.
func EnrollInboxRoot(nodeID string) string { return inboxRoot + "enroll." + nodeID }

// EnrollingInboxPrefix is the reply-inbox prefix of an agent that holds the
// bootstrap token token: `_WF_INBOX.enroll.<id>.<h>`, h a hash of the
// token (32 hex digits; it says nothing of the token or of its key in
// wf_enroll). An enrolling login may subscribe only its own token's branch
// (PermsEnrolling), so another invitation for the same node, unredeemed,
// reads none of the replies of the node's connection, whichever secret that
// connection presents now. The agent keeps the prefix after it enrolled;
// the node's permissions cover it (PermsNode).
func EnrollingInboxPrefix(nodeID, token string) string {
	sum := sha256.Sum256([]byte("warmfleet enrolling inbox\x00" + token))
	return EnrollInboxRoot(nodeID) + "." + hex.EncodeToString(sum[:16])
}

// NodeLogInboxPrefix is the reply-inbox prefix of an agent's log
// connection for one Run: inside the node's branch, apart from its main
// connection's inboxes.
func NodeLogInboxPrefix(nodeID, runID string) string {
	return NodeInboxPrefix(nodeID) + ".logs." + runID
}

// nodeLogSep joins a node id and a Run id in a log login's user name; no
// id or subject token of warmfleet's holds it.
const nodeLogSep = "/"

// NodeLogUser is the user an agent logs in as to ship one Run's output
// (PermsNodeLogs), with its session token as the secret.
func NodeLogUser(nodeID, runID string) string { return nodeID + nodeLogSep + runID }

// ParseNodeLogUser splits a NodeLogUser. ok is false unless the user holds
// one separator and both ids are one subject token.
func ParseNodeLogUser(user string) (nodeID, runID string, ok bool) {
	nodeID, runID, found := strings.Cut(user, nodeLogSep)
	if !found || strings.Contains(runID, nodeLogSep) || !SubjectToken(nodeID) || !SubjectToken(runID) {
		return "", "", false
	}
	return nodeID, runID, true
}

// IsNodeLogUser reports whether user has a log login's form, valid or not
// (it holds the separator, which no other identity's name may).
func IsNodeLogUser(user string) bool { return strings.Contains(user, nodeLogSep) }

// artifactUserSuffix ends an artifact login's user name; no node id,
// producer name or log login holds an "@".
const artifactUserSuffix = "@artifact"

// ArtifactUser is the user an agent logs in as, with a one-time token the
// control plane minted for one fetch (schemas.ArtifactLogin), to pull the
// consumer of one artifact object it was granted (PermsArtifactReader).
func ArtifactUser(nodeID string) string { return nodeID + artifactUserSuffix }

// ParseArtifactUser returns the node id of an ArtifactUser; ok is false
// unless the id is one subject token.
func ParseArtifactUser(user string) (nodeID string, ok bool) {
	nodeID, found := strings.CutSuffix(user, artifactUserSuffix)
	if !found || !SubjectToken(nodeID) || strings.Contains(nodeID, "@") || IsNodeLogUser(nodeID) {
		return "", false
	}
	return nodeID, true
}

// IsArtifactUser reports whether user has an artifact login's form, valid
// or not (it holds an "@", which no other identity's name may).
func IsArtifactUser(user string) bool { return strings.Contains(user, "@") }

// ArtifactInboxPrefix is the reply-inbox prefix of an artifact login of
// node nodeID: inside the node's branch, apart from its other connections'.
func ArtifactInboxPrefix(nodeID string) string { return NodeInboxPrefix(nodeID) + ".artifact" }

// ProducerInboxPrefix is the reply-inbox prefix of a producer's connection.
// With the nats CLI: `nats --inbox-prefix _WF_INBOX.producer.<name> ...`.
func ProducerInboxPrefix(name string) string { return inboxRoot + "producer." + name }

// SubjectToken reports whether s can be one token of a subject: non-empty,
// no dot, no wildcard, no whitespace. Identities that become part of a
// permission subject must pass it.
func SubjectToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}

// Permissions is what one identity may publish and subscribe to.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// Responses lets the identity answer each request it receives once,
	// within a minute, whatever the reply subject.
	Responses bool
}

// PermsEnrolling is what an agent holding only an invitation may do: ask
// for enrollment and read the replies on the inbox prefixes given. An
// invitation's login gets its own EnrollingInboxPrefix only, never the
// node's (NodeInboxPrefix): a fresh invitation for an enrolled node must
// not read that node's credential replies. A node's own expired session,
// let in to enroll again while its rental resumes, gets NodeInboxes.
func PermsEnrolling(nodeID string, inboxes ...string) Permissions {
	sub := make([]string, 0, len(inboxes))
	for _, in := range inboxes {
		sub = append(sub, in+".>")
	}
	return Permissions{
		Publish:   []string{SubjectEnroll},
		Subscribe: sub,
	}
}

// NodeInboxes are the reply-inbox prefixes a node's own connection may use:
// NodeInboxPrefix, and every EnrollingInboxPrefix of the node (an agent
// keeps its bootstrap token's after it enrolled).
func NodeInboxes(nodeID string) []string {
	return []string{NodeInboxPrefix(nodeID), EnrollInboxRoot(nodeID)}
}

// PermsNode is what an enrolled agent may do: publish its own
// observations, heartbeats and renewals, ask for registry credentials
// at pull time (wf.node.<id>.credentials.registry) and artifact source
// credentials per fetch (wf.node.<id>.credentials.artifact), resume its session (wf.enroll),
// and read and ack its own command consumer. As a session host
// (residency/nodehost) it also takes the control plane's requests on
// wf.node.<id>.sessions.* (and answers them: Responses), asks the
// residency service on wf.node.<id>.residency.*, and reads and acks
// session inbox consumers on WF_INBOX, which the control plane creates with
// each lease. Inbox consumers are named by session, not node, so that last
// right covers every session's inbox, and, alike, it may publish every
// session's output, of any tenant (wf.logs.*.session.>). A Run's output goes on a log
// login of its own (PermsNodeLogs). For its disk it asks what to keep on
// wf.node.<id>.disk.keep and takes prune requests on wf.node.<id>.disk.prune.
// No other JetStream API, no KV, no other node's subjects.
func PermsNode(nodeID string) Permissions {
	cons := NodeConsumer(nodeID)
	return Permissions{
		Publish: []string{
			SubjectEnroll,
			NodeObs(nodeID),
			NodeHeartbeat(nodeID),
			NodeRenew(nodeID),
			NodeRegistryCredentials(nodeID),
			NodeArtifactCredentials(nodeID),
			"$JS.API.CONSUMER.INFO." + StreamCmds + "." + cons,
			"$JS.API.CONSUMER.MSG.NEXT." + StreamCmds + "." + cons,
			"$JS.ACK." + StreamCmds + "." + cons + ".>",
			NodeResidencyService(nodeID, "*"),
			"$JS.API.CONSUMER.INFO." + StreamInbox + ".*",
			"$JS.API.CONSUMER.MSG.NEXT." + StreamInbox + ".*",
			"$JS.ACK." + StreamInbox + ".>",
			SessionLogsSubject("*", ">"),
			NodeDiskKeep(nodeID),
		},
		Subscribe: []string{NodeInboxPrefix(nodeID) + ".>", EnrollInboxRoot(nodeID) + ".>", NodeSessions(nodeID, "*"), NodeDiskPrune(nodeID)},
		Responses: true,
	}
}

// PermsNodeLogs is what an agent's log connection for one Run may do:
// publish that Run's output to WF_LOGS (RunLogsSubject, under the Run's
// tenant) and read the stream's acks on its own inbox. Nothing else: no
// other Run's subject, no node subject, no JetStream API.
func PermsNodeLogs(nodeID, tenant, runID string) Permissions {
	return Permissions{
		Publish:   []string{RunLogsSubject(tenant, runID)},
		Subscribe: []string{NodeLogInboxPrefix(nodeID, runID) + ".>"},
	}
}

// PermsArtifactReader is what a one-time artifact login may do: pull the
// one consumer the control plane created for its fetch (ArtifactConsumer,
// filtered to one object's chunks; CreateObjectRead) and read that
// consumer's info, taking the deliveries on its own inbox. It creates and
// deletes no consumer (a create request's body, deliver subject and filter
// included, is past any permission), reads no meta record or other
// object, writes nothing under $O.<bucket>.>, and has no wf.* subject.
func PermsArtifactReader(nodeID, consumer string) Permissions {
	api := ObjectStream(ObjectBucketArtifacts) + "." + consumer
	return Permissions{
		Publish: []string{
			"$JS.API.CONSUMER.INFO." + api,
			"$JS.API.CONSUMER.MSG.NEXT." + api,
		},
		Subscribe: []string{ArtifactInboxPrefix(nodeID) + ".>"},
	}
}

// PermsProducer is what producer name, of tenant, may do: submit and
// cancel Runs under its own name in its tenant (SubmitSubject,
// CancelSubject; JetStream's acks come back on its inbox), call its
// tenant's services (wf.tenant.<t>.>: Run records, stored events and
// output, secrets), feed its tenant's session inboxes, and follow its
// tenant's events and output live. Nothing of $JS.API or $KV: a direct or
// message get of WF_EVENTS, WF_LOGS or KV_wf_runs reads every tenant's
// messages, and a push consumer's deliver subject is published by the
// server past the creator's own permissions, so history is read through
// the tenant services instead.
func PermsProducer(name, tenant string) Permissions {
	return Permissions{
		Publish: []string{
			SubmitSubject(tenant, name),
			CancelSubject(tenant, name),
			TenantSubject(tenant, ">"),
			SessionInbox(tenant, "*"),
		},
		Subscribe: []string{
			"wf.events." + tenant + ".>",
			"wf.logs." + tenant + ".>",
			ProducerInboxPrefix(name) + ".>",
		},
	}
}

// Credentials are what a restricted client presents when it (re)connects.
// They can change while the connection lives: an agent swaps its
// invitation for its session token after enrolling, then reconnects.
type Credentials struct {
	mu     sync.Mutex
	user   string
	secret string
	inbox  string
	// abortOnRefusal: a refused reconnect closes the connection rather
	// than retrying with the same secret.
	abortOnRefusal bool
}

// NodeCredentials are an agent's: its node id and its invitation or
// session token.
func NodeCredentials(nodeID, secret string) *Credentials {
	return &Credentials{user: nodeID, secret: secret, inbox: NodeInboxPrefix(nodeID)}
}

// AgentCredentials are an agent's that may log in with its bootstrap token
// (bootstrap; empty when it has none): secret first, and the reply-inbox
// prefix of that token's login (EnrollingInboxPrefix) for the connection's
// whole life, which its session's permissions cover too. Without a
// bootstrap token they are NodeCredentials.
func AgentCredentials(nodeID, secret, bootstrap string) *Credentials {
	c := NodeCredentials(nodeID, secret)
	if bootstrap != "" {
		c.inbox = EnrollingInboxPrefix(nodeID, bootstrap)
	}
	return c
}

// ProducerCredentials are a producer's: its name and its producer token.
func ProducerCredentials(name, secret string) *Credentials {
	return &Credentials{user: name, secret: secret, inbox: ProducerInboxPrefix(name)}
}

// NodeLogCredentials are an agent's log connection for one Run: user
// NodeLogUser(nodeID, runID), the node's session token, NodeLogInboxPrefix.
// A refused reconnect (the Run was booked elsewhere, the session ended)
// closes the connection; the agent dials again with its current token.
func NodeLogCredentials(nodeID, runID, sessionToken string) *Credentials {
	return &Credentials{user: NodeLogUser(nodeID, runID), secret: sessionToken,
		inbox: NodeLogInboxPrefix(nodeID, runID), abortOnRefusal: true}
}

// OperatorCredentials are an operator's: full permissions, the ordinary
// inbox prefix.
func OperatorCredentials(secret string) *Credentials {
	return &Credentials{user: OperatorUser, secret: secret}
}

// SetSecret replaces the secret; the next (re)connect presents it.
func (c *Credentials) SetSecret(secret string) {
	c.mu.Lock()
	c.secret = secret
	c.mu.Unlock()
}

// Secret returns the current secret.
func (c *Credentials) Secret() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secret
}

// User returns the user name presented.
func (c *Credentials) User() string { return c.user }

// Options are the nats.Options that present these credentials on every
// connect, keep reconnecting after a refusal (the secret may change, or
// the callout service may not be up yet; not for NodeLogCredentials), and
// use the identity's own reply-inbox prefix.
func (c *Credentials) Options() []nats.Option {
	opts := []nats.Option{
		nats.UserInfoHandler(func() (string, string) {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.user, c.secret
		}),
	}
	if !c.abortOnRefusal {
		opts = append(opts, nats.IgnoreAuthErrorAbort())
	}
	if c.inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inbox))
	}
	return opts
}

// IsAuthError reports whether err is NATS refusing a login or an
// operation for lack of permission.
func IsAuthError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrPermissionViolation) {
		return true
	}
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "authorization violation") || strings.Contains(s, "permissions violation") || strings.Contains(s, "authentication")
}

// Environment the operator CLI reads to log in (docs/security.md).
const (
	EnvNATSUser       = "WARMFLEET_NATS_USER"       // default "operator"
	EnvNATSTokenFile  = "WARMFLEET_NATS_TOKEN_FILE" // the token (operator or producer)
	EnvNATSInboxName  = "WARMFLEET_NATS_PRODUCER"   // set: log in as this producer (own inbox prefix)
	EnvNATSCAFile     = "WARMFLEET_NATS_CA"
	EnvNATSCertFile   = "WARMFLEET_NATS_CERT"
	EnvNATSKeyFile    = "WARMFLEET_NATS_KEY"
	envNATSTokenValue = "WARMFLEET_NATS_TOKEN" // the token itself; prefer the file
)

// EnvClientOptions are a CLI's connection options from the environment:
// TLS files and credentials. None are needed against an open server.
func EnvClientOptions() ([]nats.Option, error) {
	opts, err := TLSFiles{CAFile: os.Getenv(EnvNATSCAFile), CertFile: os.Getenv(EnvNATSCertFile), KeyFile: os.Getenv(EnvNATSKeyFile)}.ClientOptions()
	if err != nil {
		return nil, err
	}
	secret := os.Getenv(envNATSTokenValue)
	if f := os.Getenv(EnvNATSTokenFile); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("bus: %s: %w", EnvNATSTokenFile, err)
		}
		secret = strings.TrimSpace(string(b))
	}
	if secret == "" {
		return opts, nil
	}
	var c *Credentials
	switch p := os.Getenv(EnvNATSInboxName); {
	case p != "":
		c = ProducerCredentials(p, secret)
	case os.Getenv(EnvNATSUser) != "" && os.Getenv(EnvNATSUser) != OperatorUser:
		c = &Credentials{user: os.Getenv(EnvNATSUser), secret: secret}
	default:
		c = OperatorCredentials(secret)
	}
	return append(opts, c.Options()...), nil
}
