package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmfork/vmfork/contract"
)

func TestPlaceholders(t *testing.T) {
	ph, err := Placeholders([]string{"TOKEN", "DB_PASSWORD"})
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range ph {
		if !placeholderRE.MatchString(p) || !strings.HasPrefix(p, "vmfork-secret-"+name+"-") {
			t.Errorf("%s: placeholder %q", name, p)
		}
	}
	again, _ := NewPlaceholder("TOKEN")
	if again == ph["TOKEN"] {
		t.Error("two placeholders for one secret are equal: they must be random")
	}
	if _, err := NewPlaceholder("lower"); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("a name the contract refuses: %v", err)
	}
}

func TestGuestFiles(t *testing.T) {
	ph := map[string]string{"TOKEN": "vmfork-secret-TOKEN-0123456789abcdef", "DB": "vmfork-secret-DB-fedcba9876543210"}
	files, err := GuestFiles(Guest{Placeholders: ph, ProxyURL: "http://10.0.2.100:3128", NoProxy: []string{"10.0.2.2"}, CAPEM: []byte("PEM")})
	if err != nil {
		t.Fatal(err)
	}
	want := `# Written by vmfork: brokered secrets (placeholders; the host adds the values) and their proxy.
DB=vmfork-secret-DB-fedcba9876543210
TOKEN=vmfork-secret-TOKEN-0123456789abcdef
HTTPS_PROXY=http://10.0.2.100:3128
https_proxy=http://10.0.2.100:3128
HTTP_PROXY=http://10.0.2.100:3128
http_proxy=http://10.0.2.100:3128
NO_PROXY=localhost,127.0.0.1,::1,10.0.2.2
no_proxy=localhost,127.0.0.1,::1,10.0.2.2
NODE_EXTRA_CA_CERTS=/etc/vmfork/ca.pem
`
	if got := string(files[GuestEnvFile]); got != want {
		t.Errorf("%s:\n%s\nwant:\n%s", GuestEnvFile, got, want)
	}
	if got := string(files["/etc/vmfork/secrets/TOKEN"]); got != ph["TOKEN"] {
		t.Errorf("secret file %q, want the placeholder", got)
	}
	if string(files[GuestCAFile]) != "PEM" || len(files) != 4 {
		t.Errorf("files: %v", files)
	}
	for _, bad := range []Guest{
		{Placeholders: ph, ProxyURL: "https://10.0.2.100:3128", CAPEM: []byte("x")},
		{Placeholders: ph, ProxyURL: "10.0.2.100:3128", CAPEM: []byte("x")},
		{Placeholders: ph, ProxyURL: "http://10.0.2.100:3128"},
		{Placeholders: map[string]string{"TOKEN": ph["DB"]}, ProxyURL: "http://10.0.2.100:3128", CAPEM: []byte("x")},
		{Placeholders: ph, ProxyURL: "http://10.0.2.100:3128", NoProxy: []string{"a b"}, CAPEM: []byte("x")},
	} {
		if _, err := GuestFiles(bad); !errors.Is(err, contract.ErrInvalid) {
			t.Errorf("GuestFiles(%+v): %v, want ErrInvalid", bad, err)
		}
	}
}

func TestTrustStoreOf(t *testing.T) {
	for id, want := range map[string]string{
		"debian": "update-ca-certificates", "ubuntu": "update-ca-certificates", "alpine": "update-ca-certificates",
		"fedora": "update-ca-trust", "rhel": "update-ca-trust", "opensuse-leap": "update-ca-certificates",
	} {
		ts, ok := TrustStoreOf(id)
		if !ok || ts.Update[0] != want {
			t.Errorf("%s: %+v %v, want %s", id, ts, ok, want)
		}
	}
	if _, ok := TrustStoreOf("plan9"); ok {
		t.Error("an unknown family has a trust store")
	}
}
