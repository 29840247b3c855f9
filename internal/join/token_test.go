package join

import (
	"errors"
	"strings"
	"testing"
)

func TestParseToken(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	hash := CAHash(ca)
	for _, tc := range []struct {
		in, hash, secret, err string
	}{
		{in: "0123456789abcdef", secret: "0123456789abcdef"},
		{in: "K10" + hash + "::0123456789abcdef", hash: hash, secret: "0123456789abcdef"},
		{in: "K10" + strings.ToUpper(hash) + "::0123456789abcdef", hash: hash, secret: "0123456789abcdef"},
		{in: "short", err: "at least 16"},
		{in: "K10abc::0123456789abcdef", err: "64 hex digits"},
		{in: "K10" + strings.Repeat("z", 64) + "::0123456789abcdef", err: "not hex"},
		{in: "K10" + hash + "::short", err: "at least 16"},
		{in: "0123456789 abcdef", err: "without spaces"},
	} {
		got, err := ParseToken(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseToken(%q) error %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.CAHash != tc.hash || got.Secret != tc.secret {
			t.Errorf("ParseToken(%q) = %+v, %v; want hash %q secret %q", tc.in, got, err, tc.hash, tc.secret)
		}
		if again, err := ParseToken(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", tc.in, again, err)
		}
	}
}

func TestTokenCheckCA(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	other := []byte("-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n")
	plain := Token{Secret: "0123456789abcdef"}
	if err := plain.CheckCA(other); err != nil {
		t.Errorf("a token without a hash refused a CA: %v", err)
	}
	pinned := plain.WithCA(ca)
	if err := pinned.CheckCA(ca); err != nil {
		t.Errorf("the pinned CA was refused: %v", err)
	}
	if err := pinned.CheckCA(other); !errors.Is(err, ErrCAHashMismatch) {
		t.Errorf("another CA: %v, want ErrCAHashMismatch", err)
	}
}
