package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is an in-process JetStream cluster of nats-servers owned by one
// test: each node has its own file store and fixed loopback ports, so a
// stopped node restarts as itself.
type Cluster struct {
	Nodes []*ClusterNode
}

// ClusterNode is one server of a Cluster.
type ClusterNode struct {
	Name     string
	StoreDir string
	port     int
	route    int
	routes   []string
	srv      *server.Server
}

// StartCluster starts n JetStream servers routed to each other and waits
// until the cluster has a JetStream meta leader. Every node is shut down
// when t ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	ports := freePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		dir, err := os.MkdirTemp("", "wfnatsc")
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		c.Nodes = append(c.Nodes, &ClusterNode{Name: fmt.Sprintf("wf-%d", i), StoreDir: dir, port: ports[i], route: ports[n+i], routes: routes})
	}
	for _, nd := range c.Nodes {
		nd.Start(t)
	}
	t.Cleanup(func() {
		for _, nd := range c.Nodes {
			nd.Stop()
		}
	})
	c.WaitReady(t, 60*time.Second)
	return c
}

// URLs is every node's client URL, comma-separated, for a client that
// should fail over between them.
func (c *Cluster) URLs() string {
	var u []string
	for _, nd := range c.Nodes {
		u = append(u, nd.URL())
	}
	return strings.Join(u, ",")
}

// URLsFrom is URLs starting at node i, so clients can be spread over nodes.
func (c *Cluster) URLsFrom(i int) string {
	var u []string
	for j := range c.Nodes {
		u = append(u, c.Nodes[(i+j)%len(c.Nodes)].URL())
	}
	return strings.Join(u, ",")
}

// WaitReady waits until JetStream answers through some running node.
func (c *Cluster) WaitReady(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		nc, err := nats.Connect(c.URLs(), nats.Timeout(2*time.Second))
		if err == nil {
			js, jerr := jetstream.New(nc)
			if jerr == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err = js.AccountInfo(ctx)
				cancel()
			} else {
				err = jerr
			}
			nc.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: JetStream cluster not ready in %s: %v", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URL is the node's client URL.
func (nd *ClusterNode) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", nd.port) }

// Running reports whether the node's server runs.
func (nd *ClusterNode) Running() bool { return nd.srv != nil }

// Start starts (or restarts) the node on its ports and store.
func (nd *ClusterNode) Start(t testing.TB) {
	t.Helper()
	opts := &server.Options{
		ServerName: nd.Name, Host: "127.0.0.1", Port: nd.port,
		JetStream: true, StoreDir: nd.StoreDir, NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "warmfleet-test", Host: "127.0.0.1", Port: nd.route},
		Routes:  server.RoutesFromStr(strings.Join(nd.routes, ",")),
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testenv: configure cluster node %s: %v", nd.Name, err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatalf("testenv: cluster node %s not ready in 10s", nd.Name)
	}
	nd.srv = srv
}

// Stop shuts the node down, as a crashed or stopped nats-server.
func (nd *ClusterNode) Stop() {
	if nd.srv == nil {
		return
	}
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

// freePorts reserves n distinct loopback ports (free when returned).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testenv: free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}
