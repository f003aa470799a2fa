package policy

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// A signature is the last line of the node file itself, a comment, so that
// an engine that ships the file's text verbatim carries it to the worker
// unchanged (SIGNING.md is the format's definition):
//
//	# fluksio-signature: v1 key=<key id> [expires=<RFC 3339 UTC>] sig=<base64>
//
// The signed message is the line up to " sig=", a newline, then every byte
// of the file before the line. Signing the line's own fields binds the key
// id and the expiry: neither can be edited without breaking the signature.
const (
	signaturePrefix = "# fluksio-signature: "
	signatureV1     = "v1"
	sigField        = " sig="
)

// signatureLine is the grammar of a v1 line, whole; the expiry is a UTC
// time to the second.
var signatureLine = regexp.MustCompile(`^# fluksio-signature: v1 key=([0-9a-f]{16})(?: expires=([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z))? sig=([A-Za-z0-9+/]{86}==)$`)

// splitSignature finds a file's signature line: its last line that is not
// blank, when that begins with the signature prefix. It returns the bytes
// before the line (what is signed) and the line, or ok false when the file
// ends in another line.
func splitSignature(src []byte) (body []byte, line string, ok bool) {
	trimmed := bytes.TrimRight(src, " \t\r\n")
	start := bytes.LastIndexByte(trimmed, '\n') + 1
	last := string(trimmed[start:])
	if !strings.HasPrefix(last, signaturePrefix) {
		return src, "", false
	}
	return src[:start], last, true
}

// signedMessage is what the key signs for a line whose fields (before
// " sig=") are head.
func signedMessage(head string, body []byte) []byte {
	msg := make([]byte, 0, len(head)+1+len(body))
	msg = append(msg, head...)
	msg = append(msg, '\n')
	return append(msg, body...)
}

// Sign returns src signed with key: any signature line it ends in is
// replaced, and a newline ends the text before the new line. expires, when
// not zero, is the last moment the signature is accepted.
func Sign(src []byte, key ed25519.PrivateKey, expires time.Time) []byte {
	body, _, signed := splitSignature(src)
	if !signed {
		body = bytes.TrimRight(src, " \t\r\n")
		if len(body) > 0 {
			body = append(bytes.Clone(body), '\n')
		}
	}
	head := signaturePrefix + signatureV1 + " key=" + KeyID(key.Public().(ed25519.PublicKey))
	if !expires.IsZero() {
		head += " expires=" + expires.UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	sig := ed25519.Sign(key, signedMessage(head, body))
	out := make([]byte, 0, len(body)+len(head)+100)
	out = append(out, body...)
	out = append(out, head...)
	out = append(out, sigField...)
	out = append(out, base64.StdEncoding.EncodeToString(sig)...)
	return append(out, '\n')
}

// Signature errors say why source is refused; the policy adds what the
// owner can change.
var (
	ErrUnsigned = errors.New("the source carries no signature line (its last line is not '" + strings.TrimSpace(signaturePrefix) + " …')")
)

// UntrustedKeyError: the source is signed with a key not given to
// --trust-key. Who fixes it depends on who is right: the author signs with
// a trusted key, or the owner trusts this one.
type UntrustedKeyError struct{ ID string }

func (e *UntrustedKeyError) Error() string {
	return "the source is signed with key " + e.ID + ", which this worker does not trust"
}

// ExpiredError: the signature's expires= is past; the author signs again.
type ExpiredError struct{ ID, At string }

func (e *ExpiredError) Error() string {
	return "the signature of key " + e.ID + " expired at " + e.At
}

// Verify checks src's signature line against the trusted keys at now. It
// returns the key id that signed it, or why the source is refused.
func (r *KeyRing) Verify(src []byte, now time.Time) (string, error) {
	body, line, ok := splitSignature(src)
	if !ok {
		return "", ErrUnsigned
	}
	m := signatureLine.FindStringSubmatch(line)
	if m == nil {
		if !strings.HasPrefix(line, signaturePrefix+signatureV1+" ") {
			return "", fmt.Errorf("the signature line is of an unknown version (this worker reads %s): %.80q", signatureV1, line)
		}
		return "", fmt.Errorf("the signature line is malformed (expected 'key=<16 hex> [expires=YYYY-MM-DDTHH:MM:SSZ] sig=<base64 of 64 bytes>'): %.120q", line)
	}
	id, expiry, sig64 := m[1], m[2], m[3]
	pub, trusted := r.keys[id]
	if !trusted {
		return "", &UntrustedKeyError{ID: id}
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "", fmt.Errorf("the signature line is malformed: sig= is not %d bytes of base64", ed25519.SignatureSize)
	}
	head := line[:strings.LastIndex(line, sigField)]
	if !ed25519.Verify(pub, signedMessage(head, body), sig) {
		return "", fmt.Errorf("the signature of key %s does not match the source: it changed since it was signed (a byte, a line ending), or the line was edited", id)
	}
	if expiry != "" {
		at, err := time.Parse(time.RFC3339, expiry)
		if err != nil {
			return "", fmt.Errorf("the signature line is malformed: expires=%s is not a time: %w", expiry, err)
		}
		if now.After(at) {
			return "", &ExpiredError{ID: id, At: expiry}
		}
	}
	return id, nil
}
