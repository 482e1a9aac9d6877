package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// benchDigest is a made-up image digest; the noop runtime holds it.
func benchDigest(name string) string {
	s := sha256.Sum256([]byte(name))
	return "sha256:" + hex.EncodeToString(s[:])
}

// runRequest is a typical RunRequest: an image pinned by digest, a command,
// a little env, resources, labels.
func runRequest(requestID, image string) schemas.RunRequest {
	return schemas.RunRequest{
		RequestID: requestID,
		Image:     image,
		Command:   []string{"sh", "-c", "echo hello from warmfleet-bench"},
		Env:       map[string]string{"BENCH": "1", "MODE": "intake"},
		Resources: schemas.Resources{CPUMillis: 10, MemoryBytes: 16 << 20},
		Labels:    map[string]string{"team": "bench"},
		// MaxRuntimeSeconds keeps placement's expected end finite.
		MaxRuntimeSeconds: 600,
	}
}

// submitMsg encodes req as a producer sends it: JSON with the Content-Type
// header, as `warmfleet run submit` does, or msgpack.
func submitMsg(req schemas.RunRequest, enc codec.Encoding) (*nats.Msg, error) {
	var (
		b   []byte
		err error
	)
	if enc == codec.JSON {
		b, err = json.Marshal(req)
	} else {
		b, err = codec.Encode(codec.MsgPack, req)
	}
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: bus.SubmitSubject(schemas.DefaultTenant, bus.OperatorUser), Data: b, Header: nats.Header{}}
	m.Header.Set(codec.ContentTypeHeader, enc.ContentType())
	return m, nil
}

func parseEncoding(s string) (codec.Encoding, error) {
	switch s {
	case "json":
		return codec.JSON, nil
	case "msgpack":
		return codec.MsgPack, nil
	}
	return 0, fmt.Errorf("--encoding %q: use json or msgpack", s)
}
