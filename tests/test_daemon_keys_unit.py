"""The KCL daemon's credentials providers, tableName and finished-lease cleanup, as rules
(tier 1: no process, no emulator)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kinesis_dstream.aws.kinesis import Shard
from kinesis_dstream.aws.lease_table import Lease
from kinesis_dstream.config import SERVICE_CREDENTIAL_FIELDS, ConsumerConfig
from kinesis_dstream.errors import ConfigurationError
from kinesis_dstream.multilang.credentials_providers import read_provider_chain
from kinesis_dstream.multilang.properties import load_properties
from kinesis_dstream.multilang.property_keys import PROPERTIES
from kinesis_dstream.records import ExtendedSequenceNumber as ESN
from kinesis_dstream.worker.lease_cleanup import LeaseCleaner, removable
from kinesis_dstream.worker.shard_sync import new_leases

pytestmark = pytest.mark.unit

ROLE = "arn:aws:iam::123456789012:role/reader"
SECRET_ID = "ext-do-not-log-7f3a"
BASE = "executableName = app.py\nstreamName = s\napplicationName = a\n"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text("print('hi')\n")
    return tmp_path


def load(directory: Path, text: str) -> Any:
    path = directory / "app.properties"
    path.write_text(BASE + text)
    return load_properties(path)


@pytest.fixture
def profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "aws_config"
    path.write_text("[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = d\n"
                    "[profile team]\naws_access_key_id = AKIDTEAM\naws_secret_access_key = t\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return path


# -- credentials providers ------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}|nightly",
     {"sts_assume_role_arn": ROLE, "sts_session_name": "nightly"}),
    (f"software.amazon.kinesis.multilang.auth.KclStsAssumeRoleCredentialsProvider|{ROLE}|s1"
     f"|externalId={SECRET_ID}|endpointRegion=eu-west-1",
     {"sts_assume_role_arn": ROLE, "sts_session_name": "s1", "sts_external_id": SECRET_ID,
      "sts_region": "eu-west-1"}),
    (f"StsAssumeRoleCredentialsProvider|{ROLE}|s2|endpoint=sts.example.com^us-west-2",
     {"sts_assume_role_arn": ROLE, "sts_session_name": "s2",
      "sts_endpoint": "https://sts.example.com", "sts_region": "us-west-2"}),
    (f"STSAssumeRoleSessionCredentialsProvider|{ROLE}|s3",  # KCL 2.x, SDK v1
     {"sts_assume_role_arn": ROLE, "sts_session_name": "s3"}),
    (f"KclSTSAssumeRoleSessionCredentialsProvider|{ROLE}|s4|externalId={SECRET_ID}",
     {"sts_assume_role_arn": ROLE, "sts_session_name": "s4", "sts_external_id": SECRET_ID}),
    # The session name is optional here (Databricks' rule): the clients name one.
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}", {"sts_assume_role_arn": ROLE}),
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}|externalId={SECRET_ID}",
     {"sts_assume_role_arn": ROLE, "sts_external_id": SECRET_ID}),
    ("DefaultAWSCredentialsProviderChain", {}),
    ("com.amazonaws.auth.DefaultAWSCredentialsProviderChain", {}),
    ("DefaultCredentialsProvider", {}),
    ("ProfileCredentialsProvider|team", {"aws_profile": "team"}),
    ("ProfileCredentialsProvider", {"aws_profile": "default"}),
    # A chain: the first provider that can give credentials here.
    ("EnvironmentVariableCredentialsProvider, ProfileCredentialsProvider|team",
     {"aws_profile": "team"}),
    ("ProfileCredentialsProvider|nobody,DefaultCredentialsProvider", {}),
])
def test_provider_forms_give_the_credential_fields(profiles, value, expected):
    got = read_provider_chain("AWSCredentialsProvider", value, environ={})
    assert set(got) == set(SERVICE_CREDENTIAL_FIELDS)
    assert {k: v for k, v in got.items() if v is not None} == expected


def test_environment_provider_needs_the_variables(profiles):
    env = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "s"}
    assert read_provider_chain("k", "EnvironmentVariableCredentialsProvider", environ=env) == \
        dict.fromkeys(SERVICE_CREDENTIAL_FIELDS)
    with pytest.raises(ConfigurationError, match="AWS_SECRET_ACCESS_KEY set"):
        read_provider_chain("k", "EnvironmentVariableCredentialsProvider",
                            environ={"AWS_ACCESS_KEY_ID": "AKID"})


@pytest.mark.parametrize("value, provider, why", [
    ("SystemPropertyCredentialsProvider", "SystemPropertyCredentialsProvider", "JVM"),
    ("com.amazonaws.auth.SystemPropertiesCredentialsProvider",
     "SystemPropertiesCredentialsProvider", "JVM"),
    ("InstanceProfileCredentialsProvider", "InstanceProfileCredentialsProvider",
     "DefaultCredentialsProvider"),
    ("WebIdentityTokenFileCredentialsProvider", "WebIdentityTokenFileCredentialsProvider",
     "DefaultCredentialsProvider"),
    ("AnonymousCredentialsProvider", "AnonymousCredentialsProvider", "unsigned"),
    (f"StaticCredentialsProvider|AKID|{SECRET_ID}", "StaticCredentialsProvider", "environment"),
    (f"org.example.VaultProvider|{SECRET_ID}", "VaultProvider", "not a credentials provider"),
    # One refused provider refuses the chain, even after one that would do.
    ("DefaultCredentialsProvider,SystemPropertyCredentialsProvider",
     "SystemPropertyCredentialsProvider", "JVM"),
    (f"ProfileCredentialsProvider|/etc/{SECRET_ID}|team", "ProfileCredentialsProvider",
     "AWS_SHARED_CREDENTIALS_FILE"),
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}|s|region={SECRET_ID}",
     "KclStsAssumeRoleCredentialsProvider", "unknown nested property 'region'"),
    (f"KclStsAssumeRoleCredentialsProvider|{SECRET_ID}|s", "KclStsAssumeRoleCredentialsProvider",
     "role ARN"),
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}|s|endpointRegion={SECRET_ID}",
     "KclStsAssumeRoleCredentialsProvider", "not an AWS region"),
    (f"KclStsAssumeRoleCredentialsProvider|{ROLE}|s|{SECRET_ID}",
     "KclStsAssumeRoleCredentialsProvider", "3 plain arguments"),
    (f"ProfileCredentialsProvider|{SECRET_ID}", "ProfileCredentialsProvider", "profile in neither"),
])
def test_a_provider_we_cannot_honour_is_refused_naming_key_and_class_never_an_argument(
        profiles, value, provider, why):
    with pytest.raises(ConfigurationError) as info:
        read_provider_chain("AWSCredentialsProviderDynamoDB", value, environ={})
    message = str(info.value)
    assert message.startswith(f"AWSCredentialsProviderDynamoDB = {provider}") or \
        message.startswith("AWSCredentialsProviderDynamoDB: no provider"), message
    assert provider in message and why in message
    assert SECRET_ID not in message and "AKID" not in message


def test_properties_file_sets_role_profile_and_per_service_credentials(app_dir, profiles, caplog):
    with caplog.at_level(logging.DEBUG):
        config = load(app_dir, f"AWSCredentialsProvider = KclStsAssumeRoleCredentialsProvider|"
                               f"{ROLE}|nightly|externalId={SECRET_ID}\n"
                               "AWSCredentialsProviderDynamoDB = ProfileCredentialsProvider|team\n"
                               "AWSCredentialsProviderCloudWatch = DefaultCredentialsProvider\n"
                      ).config
    assert (config.sts_assume_role_arn, config.sts_session_name, config.sts_external_id) == \
        (ROLE, "nightly", SECRET_ID)
    assert SECRET_ID not in caplog.text and SECRET_ID not in repr(config)
    # Kinesis: the role. DynamoDB: the profile, not the role. CloudWatch: the default chain.
    assert config.credentials_for("kinesis") is config
    dynamodb = config.credentials_for("dynamodb")
    assert (dynamodb.aws_profile, dynamodb.sts_assume_role_arn, dynamodb.sts_external_id) == \
        ("team", None, None)
    cloudwatch = config.credentials_for("cloudwatch")
    assert (cloudwatch.aws_profile, cloudwatch.sts_assume_role_arn) == (None, None)
    # Without the service keys, DynamoDB and CloudWatch sign as Kinesis does (the KCL's rule).
    plain = load(app_dir, f"AWSCredentialsProvider = KclStsAssumeRoleCredentialsProvider|{ROLE}|s2\n"
                 ).config
    assert plain.credentials_for("dynamodb").sts_assume_role_arn == ROLE
    assert plain.to_dict()["dynamodb_credentials"] is None
    assert ConsumerConfig.from_dict(config.to_dict()).credentials_for("dynamodb").aws_profile == "team"


def test_service_credentials_follow_the_pairing_rules():
    with pytest.raises(ConfigurationError, match="dynamodb_credentials.sts_external_id"):
        ConsumerConfig(application_name="a", stream_name="s",
                       dynamodb_credentials={"sts_external_id": "x"})
    with pytest.raises(ConfigurationError, match="unknown field"):
        ConsumerConfig(application_name="a", stream_name="s",
                       cloudwatch_credentials={"region_name": "x"})


# -- tableName and cleanupLeasesUponShardCompletion -----------------------------------------------
def test_table_name_names_the_lease_table_and_cleanup_defaults_to_the_kcls(app_dir):
    config = load(app_dir, "").config
    assert config.lease_table_name == "a"
    assert config.cleanup_leases_upon_shard_completion is True  # the KCL's default
    config = load(app_dir, "tableName = shared-leases\n"
                           "cleanupLeasesUponShardCompletion = false\n").config
    assert config.lease_table_name == "shared-leases" and config.application_name == "a"
    assert config.cleanup_leases_upon_shard_completion is False
    # Other front ends keep every lease unless told.
    assert ConsumerConfig(application_name="a", stream_name="s"
                          ).cleanup_leases_upon_shard_completion is False


def test_every_key_has_a_fate_with_its_reason():
    """No key of the Java daemon is silently ignored: each one either sets something, or is
    accepted with a reason in its row (the configuration page shows it)."""
    for option in PROPERTIES.options:
        assert option.doc.strip(), option.name
        if option.target == "ignore":
            assert any(word in option.doc for word in ("no effect", "KCL 3.x", "ignored")), \
                option.name
    assert "cleanupLeasesUponShardCompletion" not in \
        {o.name for o in PROPERTIES.options if o.target == "ignore"}


def lease(key: str, checkpoint: str, parents: tuple[str, ...] = (),
          children: tuple[str, ...] = (), owner: str | None = None, counter: int = 5) -> Lease:
    return Lease(lease_key=key, lease_owner=owner, lease_counter=counter,
                 checkpoint=ESN(checkpoint), parent_shard_ids=frozenset(parents),
                 child_shard_ids=frozenset(children))


def table(*leases: Lease) -> dict[str, Lease]:
    return {lease.lease_key: lease for lease in leases}


def test_a_finished_lease_goes_once_every_child_has_started():
    parent = lease("p", "SHARD_END", children=("c1", "c2"))
    one_started = table(parent, lease("c1", "49000", parents=("p",)),
                        lease("c2", "TRIM_HORIZON", parents=("p",)))
    assert removable(one_started) == []
    both = table(parent, lease("c1", "49000", parents=("p",)), lease("c2", "49001", parents=("p",)))
    assert removable(both) == [parent]
    # A child lease missing: kept (the KCL: child lease not found, no cleanup).
    assert removable(table(parent, lease("c1", "49000", parents=("p",)))) == []
    # Children not recorded on the parent: found by their parentShardId.
    unrecorded = lease("p", "SHARD_END")
    assert removable(table(unrecorded, lease("c1", "49000", parents=("p",)))) == [unrecorded]
    # A finished shard no child names yet: kept.
    assert removable(table(unrecorded)) == []
    # Held by a worker (it releases at shard end), or not finished: kept.
    assert removable(table(lease("p", "SHARD_END", children=("c1",), owner="w"),
                           lease("c1", "49000", parents=("p",)))) == []
    assert removable(table(lease("p", "48000", children=("c1",)),
                           lease("c1", "49000", parents=("p",)))) == []


def test_a_lineage_goes_oldest_first():
    grand = lease("g", "SHARD_END", children=("p",))
    parent = lease("p", "SHARD_END", parents=("g",), children=("c",))
    child = lease("c", "49000", parents=("p",))
    assert removable(table(grand, parent, child)) == [grand]
    assert removable(table(parent, child)) == [parent]


class FakeTable:
    def __init__(self, answers: dict[str, bool]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    def delete_finished_lease(self, lease: Lease) -> bool:
        self.asked.append((lease.lease_key, lease.lease_counter))
        return self.answers[lease.lease_key]


def test_the_cleaner_deletes_under_the_read_counter_and_counts_only_what_went():
    fake = FakeTable({"p": True, "q": False})
    cleaner = LeaseCleaner(fake)  # type: ignore[arg-type]
    leases = [lease("p", "SHARD_END", children=("c",), counter=7),
              lease("c", "49000", parents=("p",)),
              lease("q", "SHARD_END", children=("d",), counter=3),
              lease("d", "AT_TIMESTAMP", parents=("q",))]
    assert cleaner.clean(leases) == ["p"]
    assert fake.asked == [("p", 7)]
    leases = [leases[2], lease("d", "50000", parents=("q",))]  # p gone from the next scan
    assert cleaner.clean(leases) == []  # q changed since read: not deleted, not counted
    assert fake.asked[-1] == ("q", 3) and cleaner.deleted == 1


def shard(shard_id: str, *parents: str, closed: bool = False) -> Shard:
    return Shard(shard_id, parents[0] if parents else None,
                 parents[1] if len(parents) > 1 else None, "0", "100", "1",
                 "9" if closed else None)


@pytest.mark.parametrize("position", ["TRIM_HORIZON", "LATEST"])
def test_shard_sync_does_not_lease_a_deleted_finished_shard_again(position):
    config = ConsumerConfig(application_name="a", stream_name="s", region_name="r",
                            initial_position=position, worker_id="w")
    shards = [shard("g", closed=True), shard("p", "g", closed=True), shard("c", "p"),
              shard("other")]
    # g and p were finished and deleted; c (p's child) has its lease.
    existing = {"c": lease("c", "49000", parents=("p",)), "other": lease("other", "1")}
    assert new_leases(shards, existing, config) == []
    # A closed shard with no leased descendant is still leased (never read yet).
    shards.append(shard("lone", closed=True))
    assert [x.lease_key for x in new_leases(shards, existing, config)] == ["lone"]


# -- the Java daemon's nested SDK client keys ---------------------------------------------------
def test_client_endpoint_overrides_are_honoured_and_other_client_keys_refused_by_name(app_dir):
    config = load(app_dir, "kinesisClient.endpointOverride = http://127.0.0.1:4567\n"
                           "dynamoDbClient.endpointOverride = http://127.0.0.1:8000\n"
                           "cloudWatchClient.endpointOverride = http://127.0.0.1:8001\n").config
    assert (config.kinesis_endpoint, config.dynamodb_endpoint, config.cloudwatch_endpoint) == \
        ("http://127.0.0.1:4567", "http://127.0.0.1:8000", "http://127.0.0.1:8001")
    with pytest.raises(ConfigurationError) as info:
        load(app_dir, "dynamoDbClient.region = eu-west-1\nkinesisClient.httpClient = x\n")
    assert "dynamoDbClient.region, kinesisClient.httpClient" in str(info.value)
    with pytest.raises(ConfigurationError, match="given twice"):
        load(app_dir, "kinesisEndpoint = http://a:1\nkinesisClient.endpointOverride = http://b:2\n")


def test_the_lease_manager_cleans_after_each_shard_sync_only_when_told():
    from kinesis_dstream.worker.lease_manager import LeaseManager

    finished = [lease("p", "SHARD_END", children=("c",)), lease("c", "49000", parents=("p",))]

    class Coordinator:
        table = FakeTable({"p": True})
        wanted_more = False

        def owned_shard_ids(self) -> list[str]:
            return []

        def known_leases(self) -> dict[str, Lease]:
            return {x.lease_key: x for x in finished}

        def take_leases(self, limit: int | None = None) -> list[str]:
            return []

    class Syncer:
        syncs = 0

        def sync(self) -> int:
            Syncer.syncs += 1
            return 0

    for flag, asked in ((False, []), (True, [("p", 5)])):
        coordinator = Coordinator()
        coordinator.table = FakeTable({"p": True})
        config = ConsumerConfig(application_name="a", stream_name="s", worker_id="w",
                                cleanup_leases_upon_shard_completion=flag)
        manager = LeaseManager(config, coordinator, Syncer(), clock=lambda: 0.0)  # type: ignore[arg-type]
        manager.sync_soon()
        manager.run_due(0.0, lambda: False)
        assert coordinator.table.asked == asked


def test_stream_arn_of_another_region_than_region_name_keeps_only_the_name(app_dir, caplog):
    arn = "arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample"  # kclpy's sample's
    with caplog.at_level(logging.WARNING):
        config = load(app_dir, f"streamArn = {arn}\nregionName = us-east-1\n").config
    assert (config.stream_name, config.stream_arn, config.kinesis_region) == \
        ("kclpysample", None, "us-east-1")
    assert "streamArn is in us-east-5, regionName us-east-1" in caplog.text
    config = load(app_dir, f"streamArn = {arn}\nregionName = us-east-5\n").config
    assert (config.stream_arn, config.kinesis_region) == (arn, "us-east-5")
