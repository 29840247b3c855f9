package join

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// Token is a cluster token as operators pass it around: a secret, optionally preceded by the SHA-256 of the
// cluster CA in k3s's form, "K10<hex sha256 of the CA PEM>::<secret>". The hash lets a joining member check
// the CA it is offered before it sends anything secret; the secret is what servers compare.
type Token struct {
	CAHash string // lower-case hex SHA-256 of the CA certificate PEM; empty when the token carries none
	Secret string
}

const tokenPrefix = "K10"

// ParseToken reads a token in either form. A secret is at least 16 characters without spaces or ':'.
func ParseToken(s string) (Token, error) {
	t := Token{Secret: s}
	if rest, ok := strings.CutPrefix(s, tokenPrefix); ok && strings.Contains(rest, "::") {
		t.CAHash, t.Secret, _ = strings.Cut(rest, "::")
		if len(t.CAHash) != 2*sha256.Size {
			return Token{}, fmt.Errorf("the CA hash after %q must be %d hex digits, got %d", tokenPrefix, 2*sha256.Size, len(t.CAHash))
		}
		if _, err := hex.DecodeString(t.CAHash); err != nil {
			return Token{}, fmt.Errorf("the CA hash after %q is not hex", tokenPrefix)
		}
		t.CAHash = strings.ToLower(t.CAHash)
	}
	if len(t.Secret) < 16 || strings.ContainsAny(t.Secret, " \t\n:") {
		return Token{}, fmt.Errorf("the secret must be at least 16 characters, without spaces or ':'")
	}
	return t, nil
}

// String is the token in the form it was given: with the CA hash when it has one.
func (t Token) String() string {
	if t.CAHash == "" {
		return t.Secret
	}
	return tokenPrefix + t.CAHash + "::" + t.Secret
}

// WithCA is the token carrying the hash of caPEM.
func (t Token) WithCA(caPEM []byte) Token { return Token{CAHash: CAHash(caPEM), Secret: t.Secret} }

// CAHash is the hash a token carries for a CA certificate (PEM), as k3s computes it.
func CAHash(caPEM []byte) string {
	sum := sha256.Sum256(caPEM)
	return hex.EncodeToString(sum[:])
}

// CheckCA says whether caPEM is the CA the token names; a token without a hash accepts any CA (the caller
// checks the CA's HMAC under the secret as well).
func (t Token) CheckCA(caPEM []byte) error {
	if t.CAHash == "" || subtle.ConstantTimeCompare([]byte(t.CAHash), []byte(CAHash(caPEM))) == 1 {
		return nil
	}
	return ErrCAHashMismatch
}

// ErrCAHashMismatch means the CA offered is not the one whose hash the token carries.
var ErrCAHashMismatch = fmt.Errorf("the cluster CA offered by the server does not match the CA hash in the token (K10<hash>::): this is not the cluster the token was issued for")

// SecretEqual compares secrets in constant time.
func SecretEqual(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Verify checks a CAResponse against the token: the CA's hash when the token carries one, then the HMAC
// under its secret. It returns the CA PEM.
func (t Token) Verify(resp CAResponse) ([]byte, error) {
	if err := t.CheckCA([]byte(resp.CA)); err != nil {
		return nil, err
	}
	return VerifyCA(t.Secret, resp)
}
