# Builds storm and installs it: `make install` (PREFIX=/usr/local), or into a staging tree
# with `make install DESTDIR=/tmp/stage PREFIX=/usr`. The Debian package (cargo-deb, see
# storm-cli/Cargo.toml) installs the same files under /usr.
#
#   PREFIX/bin                       storm-submit, storm, storm-mm, storm-nm, storm-relay,
#                                    storm-peer, storm-testbed, storm-local, storm-bench
#   PREFIX/libexec/storm/storm-pl    the node's launcher (storm-nm finds it there)
#   PREFIX/libexec/storm/storm-pmix  the node's PMIx server (storm-nm starts it)
#   PREFIX/lib/storm/libstorm_pmi.so the PMI-1 library of --mpi openmpi jobs
#   PREFIX/share/man/man1            man pages, one per tool and per `storm` subcommand
#   PREFIX/share/...                 bash, zsh and fish completions
#   SYSTEMD_UNIT_DIR                 storm-mm, storm-nm, storm-relay, storm-relay-manager
#                                    and storm-peer units (not enabled)
#   /etc/storm                       where the cluster file goes (docs/operations.md)

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR := $(PREFIX)/bin
LIBEXECDIR := $(PREFIX)/libexec/storm
LIBDIR := $(PREFIX)/lib/storm
MANDIR := $(PREFIX)/share/man/man1
BASHDIR := $(PREFIX)/share/bash-completion/completions
ZSHDIR := $(PREFIX)/share/zsh/vendor-completions
FISHDIR := $(PREFIX)/share/fish/vendor_completions.d
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc

CARGO ?= cargo
TOOLS := storm-submit storm storm-mm storm-nm storm-relay storm-peer storm-testbed storm-local storm-bench
UNITS := storm-mm storm-nm storm-relay storm-relay-manager storm-peer
RELEASE := target/release
DIST := target/dist

.PHONY: all build docs install uninstall deb

all: build docs

# The whole workspace, as `cargo build --release` builds it: building some packages alone
# resolves their dependencies' features differently and rebuilds them.
build:
	$(CARGO) build --release --locked

docs: build
	dist/generate-docs $(RELEASE) $(DIST)

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(LIBDIR) \
		$(DESTDIR)$(MANDIR) $(DESTDIR)$(BASHDIR) $(DESTDIR)$(ZSHDIR) $(DESTDIR)$(FISHDIR) \
		$(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSCONFDIR)/storm
	for t in $(TOOLS); do install -m 755 $(RELEASE)/$$t $(DESTDIR)$(BINDIR)/$$t; done
	install -m 755 $(RELEASE)/storm-pl $(DESTDIR)$(LIBEXECDIR)/storm-pl
	install -m 755 $(RELEASE)/storm-pmix $(DESTDIR)$(LIBEXECDIR)/storm-pmix
	install -m 644 $(RELEASE)/libstorm_pmi.so $(DESTDIR)$(LIBDIR)/libstorm_pmi.so
	install -m 644 $(DIST)/man1/*.1 $(DESTDIR)$(MANDIR)/
	install -m 644 $(DIST)/bash-completion/* $(DESTDIR)$(BASHDIR)/
	install -m 644 $(DIST)/zsh/* $(DESTDIR)$(ZSHDIR)/
	install -m 644 $(DIST)/fish/* $(DESTDIR)$(FISHDIR)/
	for u in $(UNITS); do \
		sed 's|/usr/bin/|$(BINDIR)/|g; s|/etc/storm/|$(SYSCONFDIR)/storm/|g; s|/etc/default/|$(SYSCONFDIR)/default/|g' \
			dist/systemd/$$u.service > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; \
		chmod 644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; \
	done

uninstall:
	for t in $(TOOLS); do rm -f $(DESTDIR)$(BINDIR)/$$t; done
	rm -rf $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(LIBDIR)
	rm -f $(DESTDIR)$(MANDIR)/storm*.1
	for u in $(UNITS); do rm -f $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; done
	for t in $(TOOLS); do rm -f $(DESTDIR)$(BASHDIR)/$$t $(DESTDIR)$(ZSHDIR)/_$$t \
		$(DESTDIR)$(FISHDIR)/$$t.fish; done

# The Debian package, from what `make all` built (needs cargo-deb: cargo install cargo-deb).
deb: all
	$(CARGO) deb -p storm-cli --no-build --fast
