package artifactstore

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// maxRedirects is net/http's own bound, kept when a client brings no
// CheckRedirect of its own.
const maxRedirects = 10

// credentialHeaders are dropped on a redirect to another origin whatever
// the configured headers are: net/http drops Authorization and Cookie only
// when the domain changes, and keeps them from a host to its subdomain; it
// sets Referer to the previous URL, whose query may be a presigned secret.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Cookie2", "Referer"}

// keepCredentials is a CheckRedirect that keeps an artifact source's
// credential with the host it was configured for. A redirect from https
// to plain http is refused outright (the bytes and any credential would
// cross the network in clear, and a downgraded fetch is not the source the
// operator named). A redirect to another origin (scheme, host and port,
// default ports filled in) goes without any of headers and without the
// credentialHeaders. net/http copies the first request's headers into
// every hop before asking, so a hop back to the first origin has them
// again. next, if set, is the client's own policy, asked first.
//
// The registry path keeps its credential the same way, per host, inside
// containerd's authorizer (adapters/containerd/registry.go, pullAuth.creds);
// no package both may import holds an HTTP rule, so each keeps its own.
func keepCredentials(next func(*http.Request, []*http.Request) error, headers map[string]string) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if next != nil {
			if err := next(req, via); err != nil {
				return err
			}
		} else if len(via) >= maxRedirects {
			return &permanent{fmt.Errorf("stopped after %d redirects", maxRedirects)}
		}
		prev := via[len(via)-1].URL
		if downgrade(via, req.URL) {
			return &permanent{fmt.Errorf("redirect from %s to plain http://%s refused: %w", prev.Scheme+"://"+prev.Host, req.URL.Host, errDowngrade)}
		}
		if origin(req.URL) != origin(via[0].URL) {
			for k := range headers {
				req.Header.Del(k)
			}
			for _, k := range credentialHeaders {
				req.Header.Del(k)
			}
		}
		return nil
	}
}

// errDowngrade: a redirect would leave https for plain http.
var errDowngrade = errors.New("an artifact fetch never leaves https for plain http")

// downgrade reports whether any hop so far was https and to is not.
func downgrade(via []*http.Request, to *url.URL) bool {
	if strings.EqualFold(to.Scheme, "https") {
		return false
	}
	for _, r := range via {
		if strings.EqualFold(r.URL.Scheme, "https") {
			return true
		}
	}
	return false
}

// origin is a URL's scheme, host and port, lower case, the scheme's
// default port filled in.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}
