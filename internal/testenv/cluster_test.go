package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/internal/testenv"
)

// TestCluster_R3SurvivesANode: an R3 bucket keeps taking writes with one of
// three nodes down, and the node comes back as itself.
func TestCluster_R3SurvivesANode(t *testing.T) {
	c := testenv.StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "r3", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	c.Nodes[0].Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kv.Put(ctx, "k", []byte("2"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write with a node down: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Nodes[0].Start(t)
	c.WaitReady(t, 30*time.Second)
}
