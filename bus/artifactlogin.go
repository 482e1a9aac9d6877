package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Transport is where and how a client reaches NATS, without any identity:
// the server URL(s) and the TLS options of a connection.
type Transport struct {
	// URL is one URL or a comma-separated list, as nats.Connect takes.
	URL string
	// Options set TLS (CA, client certificate) and nothing else.
	Options []nats.Option
}

// TransportOf is the transport of an open connection: its servers and its
// TLS settings, so a second connection reaches the same servers the same
// way.
func TransportOf(nc *nats.Conn) Transport {
	o := nc.Opts
	servers := append([]string{}, o.Servers...)
	url := o.Url
	same := func(to *nats.Options) error {
		to.Servers = servers
		to.Secure = o.Secure
		if o.TLSConfig != nil {
			to.TLSConfig = o.TLSConfig.Clone()
		}
		to.RootCAsCB, to.TLSCertCB, to.TLSHandshakeFirst = o.RootCAsCB, o.TLSCertCB, o.TLSHandshakeFirst
		return nil
	}
	return Transport{URL: url, Options: []nats.Option{same}}
}

// ArtifactLoginTimeout bounds dialing an artifact login.
const ArtifactLoginTimeout = 10 * time.Second

// DialArtifactLogin opens a connection of its own for one artifact fetch,
// logged in as user (ArtifactUser(nodeID)) with the one-time token the
// control plane answered, with its replies under ArtifactInboxPrefix(nodeID). The
// token is single-use, so the connection never reconnects: a fetch cut off
// asks for a new credential. The caller closes it after the fetch; the
// server closes it when the login expires.
func DialArtifactLogin(ctx context.Context, tr Transport, nodeID, user, token string) (*nats.Conn, error) {
	if user != ArtifactUser(nodeID) || token == "" {
		return nil, fmt.Errorf("bus: artifact login: user %q is not node %s's artifact user (%s) or has no token", user, nodeID, ArtifactUser(nodeID))
	}
	timeout := ArtifactLoginTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("bus: artifact login: %w", context.DeadlineExceeded)
	}
	opts := append([]nats.Option{}, tr.Options...)
	opts = append(opts,
		nats.Name("warmfleet-agent "+nodeID+" artifact"),
		nats.UserInfo(user, token),
		nats.CustomInboxPrefix(ArtifactInboxPrefix(nodeID)),
		nats.NoReconnect(),
		nats.RetryOnFailedConnect(false),
		nats.Timeout(timeout),
	)
	// Connect is bounded by the timeout, which ctx's deadline shortens.
	nc, err := nats.Connect(tr.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("bus: artifact login as %s: %w", user, err)
	}
	if err := ctx.Err(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: artifact login as %s: %w", user, err)
	}
	return nc, nil
}
