# Self-test of the CA handling of Dockerfile.cpu/.gpu (hack/images.sh pipcheck, tests/containers):
# the `builder` stage is Dockerfile.cpu's pybase stage verbatim (so it comes from the build cache), then pip
# downloads one small wheel from the index over TLS, trusting docker/certs/*.crt; the final stage takes the
# wheel only, exactly like the real images take /opt/venv only. The tests check that the final stage has no
# CA bundle in any layer.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS pybase
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180 PIP_CERT=/tmp/pip-ca.pem
COPY docker/certs/ /tmp/certs/
RUN if ls /tmp/certs/*.crt >/dev/null 2>&1; then \
      cat /etc/ssl/certs/ca-certificates.crt /tmp/certs/*.crt > /tmp/pip-ca.pem; \
    else cp /etc/ssl/certs/ca-certificates.crt /tmp/pip-ca.pem; fi

FROM pybase AS fetch
ARG PIPCHECK_REQUIREMENT=prometheus-client==0.26.0
ARG PIPCHECK_NONCE=0
# The building machine's pip indexes (hack/images.sh passes them; empty = pip's default).
ARG PKG_INDEX_URL=
ARG PKG_EXTRA_INDEX_URL=
RUN echo "pipcheck ${PIPCHECK_NONCE}" \
 && pip download --retries 1 --no-deps --only-binary=:all: ${PKG_INDEX_URL:+--index-url "${PKG_INDEX_URL}"} \
      ${PKG_EXTRA_INDEX_URL:+--extra-index-url "${PKG_EXTRA_INDEX_URL}"} -d /tmp/wheels "${PIPCHECK_REQUIREMENT}" \
 && ls -l /tmp/wheels

FROM ${BASE_IMAGE}
COPY --from=fetch /tmp/wheels/ /wheels/
