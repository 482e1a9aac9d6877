package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// secretEnvFlag reads one --secret-env NAME=SECRET: the workload's env var
// NAME set, at launch, to the tenant's secret SECRET.
func secretEnvFlag(arg string) (schemas.SecretEnvRef, error) {
	name, secret, ok := strings.Cut(arg, "=")
	if !ok || name == "" || secret == "" {
		return schemas.SecretEnvRef{}, fmt.Errorf("--secret-env %q: give NAME=SECRET, the env var and the name of one of the tenant's secrets (`warmfleet secret list`), e.g. --secret-env HF_TOKEN=hf-token", arg)
	}
	return schemas.SecretEnvRef{Name: name, Secret: secret}, nil
}

// secretFileFlag reads one --secret-file SECRET=PATH[:MODE]: the tenant's
// secret SECRET as a read-only file at PATH, MODE octal (default 0400).
func secretFileFlag(arg string) (schemas.SecretFileRef, error) {
	secret, rest, ok := strings.Cut(arg, "=")
	path, mode, withMode := strings.Cut(rest, ":")
	if !ok || secret == "" || path == "" || (withMode && mode == "") {
		return schemas.SecretFileRef{}, fmt.Errorf("--secret-file %q: give SECRET=PATH[:MODE], a secret of the tenant, the absolute path of the file in the container and its octal mode (default 0400), e.g. --secret-file db-cert=/run/secrets/db.pem:0440", arg)
	}
	ref := schemas.SecretFileRef{Secret: secret, Path: path}
	if withMode {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil {
			return ref, fmt.Errorf("--secret-file %q: mode %q is not an octal number such as 0400", arg, mode)
		}
		ref.Mode = uint32(m)
	}
	return ref, nil
}

// secretRefs adds the --secret-env and --secret-file flags to req.
func (f submitFlags) secretRefs(req *schemas.RunRequest) error {
	for _, arg := range f.secretEnv {
		ref, err := secretEnvFlag(arg)
		if err != nil {
			return err
		}
		req.SecretEnv = append(req.SecretEnv, ref)
	}
	for _, arg := range f.secretFiles {
		ref, err := secretFileFlag(arg)
		if err != nil {
			return err
		}
		req.SecretFiles = append(req.SecretFiles, ref)
	}
	return nil
}
