package bus

import (
	"encoding/base64"
	"strings"
)

// Subjects. Operators publish and subscribe to these with the nats CLI.
const (
	SubjectEnroll     = "wf.enroll"
	SubjectEvents     = "wf.events.>" // WF_EVENTS: every tenant's Run and session events (RunEventsSubject, SessionEventsSubject)
	subjectNodePrefix = "wf.node."
	SubjectNodeCmdAll = "wf.node.*.cmd"
	SubjectNodeObsAll = "wf.node.*.obs"
	SubjectHeartbeats = "wf.node.*.heartbeat"
	SubjectRenewals   = "wf.node.*.renew"
	// SubjectRegistryCredentials is where agents ask for a registry
	// credential at pull time (core request/reply: a credential is never
	// at rest).
	SubjectRegistryCredentials = "wf.node.*.credentials.registry"
	// SubjectArtifactCredentials is where agents ask, per fetch, for the
	// credential of an artifact's source (core request/reply).
	SubjectArtifactCredentials = "wf.node.*.credentials.artifact"
	// SubjectArtifactRegister asks the control plane to add a catalog
	// entry (schemas.ArtifactRegistration); SubjectArtifactRemove to
	// remove one.
	SubjectArtifactRegister = "wf.admin.artifact.register"
	SubjectArtifactRemove   = "wf.admin.artifact.rm"
	// SubjectInvite is the operator's request to mint a node bootstrap.
	SubjectInvite = "wf.admin.node.invite"
	// SubjectDrain stops new work going to a node.
	SubjectDrain = "wf.admin.node.drain"
	// SubjectNodeLeases asks a control-plane replica for the live leases
	// heartbeats have earned: wf_nodes holds a node's lease only as of its
	// last state change, so heartbeats cost no KV write.
	SubjectNodeLeases = "wf.admin.node.leases"
	// SubjectPrefetch asks the control plane to warm an image on nodes
	// (schemas.PrefetchRequest); the reply is the prefetch's record.
	SubjectPrefetch = "wf.admin.prefetch"
	// SubjectRetire retires a rental once its node is idle.
	SubjectRetire = "wf.admin.rental.retire"
	// SubjectConnections answers how each capacity provider and ephemeral
	// executor connection stands ([]schemas.ConnectionStatus).
	SubjectConnections = "wf.admin.rental.connections"
	// SubjectPrune asks the control plane to have a node remove every image
	// and cache nothing running or booked uses (NodeDiskPrune relays it).
	SubjectPrune = "wf.admin.node.prune"
	// SubjectDiskKeepAll is where the control plane answers nodes asking
	// what their disk collection must keep (NodeDiskKeep).
	SubjectDiskKeepAll = "wf.node.*.disk.keep"
)

// NodeCmd is where the control plane sends commands for one node.
func NodeCmd(nodeID string) string { return subjectNodePrefix + nodeID + ".cmd" }

// SubjectNode extracts <id> from wf.node.<id>.<verb>; "" for any other
// subject.
func SubjectNode(subject string) string {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || parts[0]+"."+parts[1]+"." != subjectNodePrefix {
		return ""
	}
	return parts[2]
}

// NodeObs is where one node publishes observations.
func NodeObs(nodeID string) string { return subjectNodePrefix + nodeID + ".obs" }

// NodeHeartbeat is where one node heartbeats.
func NodeHeartbeat(nodeID string) string { return subjectNodePrefix + nodeID + ".heartbeat" }

// NodeRenew is where one node renews its session.
func NodeRenew(nodeID string) string { return subjectNodePrefix + nodeID + ".renew" }

// NodeRegistryCredentials is where one node asks for a registry
// credential (SubjectRegistryCredentials).
func NodeRegistryCredentials(nodeID string) string {
	return subjectNodePrefix + nodeID + ".credentials.registry"
}

// NodeArtifactCredentials is where one node asks for an artifact source
// credential (SubjectArtifactCredentials).
func NodeArtifactCredentials(nodeID string) string {
	return subjectNodePrefix + nodeID + ".credentials.artifact"
}

// NodeConsumer is the durable name of a node's command consumer.
func NodeConsumer(nodeID string) string { return "node-" + nodeID }

// NodeDiskKeep is where one node asks, just before it collects disk, what
// Runs booked or queued on it need kept. The node asks rather than being
// sent keep sets: the answer is as fresh as the control plane's view at
// that moment, a restarted agent needs nothing replayed, and nothing is
// sent while no disk runs short.
func NodeDiskKeep(nodeID string) string { return subjectNodePrefix + nodeID + ".disk.keep" }

// NodeDiskPrune is where the control plane asks one node's agent to prune
// its disk (core request/reply; the agent answers a PruneReport).
func NodeDiskPrune(nodeID string) string { return subjectNodePrefix + nodeID + ".disk.prune" }

// The NATS object store's layout, as nats.go's ObjectStore reads and writes
// it: a bucket is the stream OBJ_<bucket>; an object's chunks are the
// messages on $O.<bucket>.C.<nuid>, its info the last message on
// $O.<bucket>.M.<name in base64url>. Writers (PutObject) and readers that
// address chunks themselves name these subjects only through here.

// ObjectStream is the stream holding object store bucket's objects.
func ObjectStream(bucket string) string { return "OBJ_" + bucket }

// ObjectChunks is the subject of the chunks of the object stored under
// nuid (an object's ObjectInfo.NUID).
func ObjectChunks(bucket, nuid string) string { return "$O." + bucket + ".C." + nuid }

// ObjectMeta is the subject of object name's info record.
func ObjectMeta(bucket, name string) string {
	return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}
