package schemas

import "strings"

// ParseArtifactRef reads an operator's artifact reference: NAME (the
// catalog's newest version), NAME:VERSION or NAME@sha256:<hex>. It returns
// the use without a path; a refusal names field.
func ParseArtifactRef(field, s string) (ArtifactUse, error) {
	if s == "" {
		return ArtifactUse{}, refuse(CodeMissingField, field, "name an artifact: NAME, NAME:VERSION or NAME@sha256:<hex>")
	}
	if len(s) > 256 || !cleanText(s) {
		return ArtifactUse{}, refuse(CodeInvalidArtifact, field, "an artifact reference is NAME, NAME:VERSION or NAME@sha256:<hex>, at most 256 bytes")
	}
	var u ArtifactUse
	name, digest, pinned := strings.Cut(s, "@")
	if pinned {
		u.Digest = digest
		if ValidateSHA256(field, digest) != nil {
			return ArtifactUse{}, refuse(CodeInvalidDigest, field, "the part after @ must be sha256:<64 lowercase hex digits>")
		}
	}
	name, version, versioned := strings.Cut(name, ":")
	if versioned {
		if pinned {
			return ArtifactUse{}, refuse(CodeInvalidArtifact, field, "pin by version (NAME:VERSION) or by digest (NAME@sha256:<hex>), not both")
		}
		if ValidateArtifactVersion(field, version) != nil {
			return ArtifactUse{}, refuse(CodeInvalidArtifact, field, "the version after : must be [A-Za-z0-9._-], 1-64 characters, starting with a letter or digit")
		}
		u.Version = version
	}
	if !ValidArtifactName(name) {
		return ArtifactUse{}, refuse(CodeInvalidArtifact, field, "the name must be lowercase [a-z0-9._-], 1-63 characters, starting with a letter or digit (NAME, NAME:VERSION or NAME@sha256:<hex>)")
	}
	u.Name = name
	return u, nil
}

// Ref writes the use back in the form ParseArtifactRef reads.
func (u ArtifactUse) Ref() string {
	switch {
	case u.Digest != "":
		return u.Name + "@" + u.Digest
	case u.Version != "":
		return u.Name + ":" + u.Version
	}
	return u.Name
}
